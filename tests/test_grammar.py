"""llguidance's grammars over a bundle's tokenizer (speczoo/grammar.py): the masks, consume and rollback,
the end ids, invalid grammars; on the tiny byte-level qwen2 vocabulary, and (real) on every zoo model's
own tokenizer with a short constrained generation that ends at the model's EOS."""

from __future__ import annotations

import json

import pytest

from speczoo.grammar import JSON_OBJECT, Grammars, check
from speczoo.request import Constraint, GenerationRequest
from speczoo.zoo.gguf_tokenizer import read_tokenizer
from real_models import GEMMA_NAME, QWEN_NAME, SMOLLM_NAME
from tiny_gguf import write_tiny_gguf

FLAG = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                   "additionalProperties": False})


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path, _ = write_tiny_gguf(tmp_path_factory.mktemp("tok") / "q.gguf", "qwen2")
    return read_tokenizer(path)


def allowed_ids(grammar) -> set[int]:
    return set(grammar.allowed().nonzero().flatten().tolist())


def test_masks_follow_the_text_and_end_ids_come_only_when_it_is_complete(tok):
    g = Grammars(tok, tok.vocab_size + 5)(Constraint("json_schema", FLAG))    # 5 logit rows past the words
    first = allowed_ids(g)
    assert tok.encode("{")[0] in first and not first & set(tok.eos_ids)
    assert max(first) < tok.vocab_size and g.allowed().shape == (tok.vocab_size + 5,)
    ids = tok.encode('{"ok": true}')
    for t in ids:
        assert t in allowed_ids(g)
        g.consume(t)
    assert allowed_ids(g) == set(tok.eos_ids)              # complete: only an end id may follow
    g.rollback(len(ids) - 1)
    assert allowed_ids(g) != set(tok.eos_ids) and tok.encode('"')[0] in allowed_ids(g)
    with pytest.raises(ValueError, match="does not allow"):
        g.consume(tok.encode("x")[0])


def test_json_object_allows_any_object_and_a_lark_grammar_compiles(tok):
    grammars = Grammars(tok, tok.vocab_size)
    g = grammars(Constraint("json_schema", JSON_OBJECT))
    for t in tok.encode('{"a": [1, {"b": null}]}'):
        g.consume(t)
    assert set(tok.eos_ids) <= allowed_ids(g)
    lark = grammars(Constraint("lark", 'start: "yes" | "no"'))
    assert tok.encode("y")[0] in allowed_ids(lark) and tok.encode("x")[0] not in allowed_ids(lark)


@pytest.mark.parametrize("constraint, message", [
    (Constraint("json_schema", '{"type": "bogus"}'), "Invalid type: bogus"),
    (Constraint("json_schema", '{"type": '), "it is not JSON"),
    (Constraint("lark", "start: undefined_rule"), "invalid grammar"),
    (Constraint("regex", "a+"), "unknown constraint kind"),
])
def test_an_invalid_grammar_is_a_value_error_with_llguidances_message(constraint, message):
    with pytest.raises(ValueError, match=message):
        check(constraint)


@pytest.mark.real
@pytest.mark.parametrize("name", [QWEN_NAME, GEMMA_NAME, SMOLLM_NAME])
def test_every_zoo_tokenizer_constrains_a_real_generation_to_its_end(name, session_home):
    from speczoo.runtime import load_runtime

    rt = load_runtime(name, max_seq=256)
    ids = rt.chat_ids([{"role": "user", "content": "Is the sky blue? Answer as JSON."}])
    *_, done = rt.generate(GenerationRequest(ids, 30, spec="ngram", constraint=Constraint("json_schema", FLAG)))
    assert done.finish_reason == "stop" and json.loads(done.text) in ({"ok": True}, {"ok": False}), done.text
