"""The tokenizer: GGUF -> tokenizers construction, chat templates, the UTF-8-safe incremental decoder, and
parity with transformers on tiny GGUFs. Parity with llama.cpp (its vocabulary tests, and the real models
on real text) is tests/zoo/test_tokenizer_llama.py's; the vocabulary rules one by one tests/zoo/test_gguf_tokenizer.py's.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.exceptions import TemplateError
from tiny_gguf import write_tiny_gguf

from speczoo.errors import SpeczooError
from speczoo.tokenizer import BUILTIN_CHAT_TEMPLATES, Tokenizer
from speczoo.zoo.gguf_tokenizer import read_tokenizer, score_merges
from speczoo.zoo.tokparity import TokParity, stdlib_texts, tokenizer_parity

SAMPLES = ["hello world", "  the in  def\n\n\tx = 1  ", "日本語のテキスト", "emoji 😀 and family 👩‍👩‍👧!",
           "héllo wörld ñ", "mixed 日本 hello😀world", "", " ", "\n", "<|im_end|> and <end_of_turn> inline",
           "Ωμέγα \u00a0 nbsp", "a\u0301 combining", "\x00\x01 control bytes"]


@pytest.fixture(scope="module", params=["qwen2", "gemma3"])
def tok(request, tmp_path_factory):
    path, _ = write_tiny_gguf(tmp_path_factory.mktemp(request.param) / "t.gguf", request.param)
    return read_tokenizer(path, chat_template=BUILTIN_CHAT_TEMPLATES["gemma"])


def _stream(tok: Tokenizer, ids: list[int], skip_special: bool = False) -> list[str]:
    dec = tok.incremental_decoder(skip_special)
    return [dec.feed(i) for i in ids] + [dec.flush()]


# ---------------------------------------------------------------- encode / decode

def test_round_trip(tok):
    for s in SAMPLES:
        assert tok.decode(tok.encode(s)) == s, s


def test_add_special_follows_the_file(tok):
    ids = tok.encode("hello", add_special=True)
    if tok.add_bos:                                           # gemma: BOS first
        assert ids[0] == tok.bos_id == 2 and ids[1:] == tok.encode("hello")
    else:                                                     # qwen: nothing added
        assert ids == tok.encode("hello")


def test_special_tokens_are_whole_and_skippable(tok):
    special = "<|im_end|>" if tok.config["byte_decoding"] == "byte_level" else "<end_of_turn>"
    sid = tok.backend.token_to_id(special)
    assert sid in tok.eos_ids and sid in tok.special_ids
    ids = tok.encode(f"hello{special}world")
    assert sid in ids
    assert tok.decode(ids, skip_special=True) == "helloworld"
    assert "".join(_stream(tok, ids, skip_special=True)) == "helloworld"


# ---------------------------------------------------------------- incremental decoding

def test_incremental_never_emits_half_a_character(tok):
    for text in ("😀", "日本", "👩‍👩‍👧", "a😀b日c"):
        ids = tok.encode(text)
        parts = _stream(tok, ids)
        assert "".join(parts) == text
        assert all("\ufffd" not in p for p in parts)
    ids = tok.encode("😀")
    assert len(ids) == 4                                     # four byte tokens in both tiny vocabularies
    dec = tok.incremental_decoder()
    assert [dec.feed(i) for i in ids] == ["", "", "", "😀"]


def test_incremental_flush_marks_an_unfinished_character(tok):
    ids = tok.encode("x😀")[:-1]
    dec = tok.incremental_decoder()
    assert "".join(dec.feed(i) for i in ids) == "x"
    assert dec.flush() == "\ufffd"


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\u2581"), max_size=40))
def test_incremental_equals_decode(text):
    for t in _TOKS:
        ids = t.encode(text)
        assert "".join(_stream(t, ids)) == t.decode(ids) == text


@pytest.fixture(scope="module", autouse=True)
def _both(tmp_path_factory):
    """Both tiny tokenizers for the hypothesis test (which cannot take a parametrized fixture)."""
    _TOKS.clear()
    for arch in ("qwen2", "gemma3"):
        path, _ = write_tiny_gguf(tmp_path_factory.mktemp(f"h-{arch}") / "t.gguf", arch)
        _TOKS.append(read_tokenizer(path))


_TOKS: list[Tokenizer] = []


def test_incremental_feed_accepts_lists(tok):
    ids = tok.encode("日本 hello")
    dec = tok.incremental_decoder()
    assert dec.feed(ids[:3]) + dec.feed(ids[3:]) + dec.flush() == "日本 hello"


# ---------------------------------------------------------------- chat templates

def test_chatml_from_the_gguf(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "q.gguf", "qwen2")
    tok = read_tokenizer(path)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(msgs) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                             "<|im_start|>assistant\n")
    assert tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert "user\nab<|im_end|>" in tok.apply_chat_template(parts)


def test_gemma_builtin_template(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "g.gguf", "gemma3")
    tok = read_tokenizer(path, chat_template=BUILTIN_CHAT_TEMPLATES["gemma"])
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    assert tok.apply_chat_template(msgs) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    ids = tok.encode(tok.apply_chat_template(msgs[1:2]))
    assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id    # the template writes BOS; encode adds none
    with pytest.raises(TemplateError, match="alternate"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_template_helpers_match_hf(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "q.gguf", "qwen2")
    template = ("{% if not messages %}{{ raise_exception('none') }}{% endif %}"
                "{{ messages[0]['content'] | tojson }}|{{ {'k': 'ü<'} | tojson(indent=1) }}|"
                "{{ strftime_now('%Y') | length }}")
    tok = read_tokenizer(path, chat_template=None)
    tok.chat_template = template
    out = tok.apply_chat_template([{"role": "user", "content": "日本 <b>"}])
    assert out == '"日本 <b>"|' + json.dumps({"k": "ü<"}, indent=1, ensure_ascii=False) + "|4"
    with pytest.raises(TemplateError, match="none"):
        tok.apply_chat_template([])


def test_sandbox_blocks_attribute_escapes(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "q.gguf", "qwen2")
    tok = read_tokenizer(path)
    tok.chat_template = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(Exception, match="unsafe|not safely|access"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_no_template_is_a_clear_error(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "q.gguf", "qwen2", chat_template=False)
    tok = read_tokenizer(path)
    with pytest.raises(SpeczooError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_bundle_config_must_come_from_speczoo(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "q.gguf", "qwen2")
    tok = read_tokenizer(path)
    tok.save(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["eos_ids"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpeczooError, match="eos_ids"):
        Tokenizer.from_bundle(tmp_path)


# ---------------------------------------------------------------- merges derived from a vocabulary

def test_score_merges_rank_by_the_built_tokens_score():
    tokens = ["a", "b", "c", "ab", "bc", "abc", "ca"]
    scores = [0.0, 0.0, 0.0, -3.0, -1.0, -2.0, -5.0]       # bc before abc before ab, as llama.cpp's SPM picks
    assert score_merges(tokens, scores) == [("b", "c"), ("a", "bc"), ("ab", "c"), ("a", "b"), ("c", "a")]


# ---------------------------------------------------------------- parity

class _ShiftedReference:
    """A reference tokenizer that disagrees on texts containing 'world'."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, add_special_tokens=False):
        ids = self.tok.encode(text, add_special=add_special_tokens)
        return [i + 1 for i in ids] if "world" in text else ids


def test_parity_reports_mismatches_in_context(tok):
    texts = ["hello there", "the hello world in", "def in"]
    ok = tokenizer_parity(tok, None, texts, reference=tok_ref(tok))
    assert ok.mismatching == 0 and ok.identical_fraction == 1.0 and ok.texts == 3
    bad = tokenizer_parity(tok, None, texts, reference=_ShiftedReference(tok))
    assert bad.mismatching == 1 and bad.identical_fraction == pytest.approx(2 / 3)
    assert "hello world" in bad.first_mismatch and "at id 0" in bad.first_mismatch
    assert isinstance(bad, TokParity) and "1 differ" in bad.summary()


def tok_ref(tok):
    class Same:
        def encode(self, text, add_special_tokens=False):
            return tok.encode(text, add_special=add_special_tokens)
    return Same()


def test_stdlib_corpus_is_real_and_large_enough():
    texts = stdlib_texts(50_000)
    assert sum(map(len, texts)) >= 50_000 and any("def " in t for t in texts)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_parity_with_transformers_on_tiny_gguf(tmp_path, arch):
    pytest.importorskip("transformers")
    path, _ = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch)
    ours = read_tokenizer(path)
    result = tokenizer_parity(ours, path, SAMPLES + ["hello world the in def " * 20])
    assert result.mismatching == 0, result.summary()
    with_bos = tokenizer_parity(ours, path, SAMPLES, add_special=True)
    assert with_bos.mismatching == 0, with_bos.summary()
