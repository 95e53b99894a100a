"""Grammar-constrained decoding under speculation (decoding/constraint.py): the per-row masks and the
draft cut, on a toy grammar; then the engine and the batch with llguidance's grammars (speczoo/grammar.py)
on a tiny random qwen2 and its byte-level tokenizer: every speculative mode emits exactly the ids of
constrained plain decoding, and the text matches the schema.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.request import Constraint, GenerationRequest, SamplingParams
from speczoo.slots import SlotCache
from speczoo.decoding.batch import BatchEngine
from speczoo.decoding.constraint import constrain, first_path
from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.engine import MAX_K, Engine
from speczoo.decoding.round import Finished
from speczoo.decoding.types import Draft
from speczoo.grammar import JSON_OBJECT, Grammars
from speczoo.zoo.gguf_tokenizer import read_tokenizer
from offered import offered
from tiny import tiny_model
from tiny_gguf import write_tiny_gguf

MAX_SEQ = 256


class Alternating:
    """A toy grammar over V tokens: after an even token only odd ones, after an odd one only even ones
    (the start allows all); it records what it consumed."""

    def __init__(self, v: int):
        self.v, self.seen = v, []

    def allowed(self):
        if not self.seen:
            return torch.ones(self.v, dtype=torch.bool)
        return torch.tensor([(t + self.seen[-1]) % 2 == 1 for t in range(self.v)])

    def consume(self, token):
        assert bool(self.allowed()[token]), f"consumed a forbidden token {token}"
        self.seen.append(token)

    def rollback(self, n):
        del self.seen[len(self.seen) - n:]


def test_a_draft_is_cut_at_the_first_token_the_grammar_forbids():
    g = Alternating(6)
    g.consume(1)                                              # a0
    c = constrain(g, Draft(tokens=[2, 3, 5, 0]))              # 5 after 3: forbidden
    assert c.draft.tokens == [2, 3] and c.consumed == 2 and g.seen == [1, 2, 3]
    assert c.masks.shape == (3, 6)
    assert c.masks[0].tolist() == [True, False, True, False, True, False]     # after a0 = 1: even
    assert c.masks[2].tolist() == [True, False, True, False, True, False]     # after 3: even


def test_a_sampled_draft_keeps_its_forbidden_token_for_an_exact_rejection():
    g = Alternating(6)
    g.consume(1)
    probs = torch.full((3, 6), 1 / 6)
    c = constrain(g, Draft(tokens=[2, 4, 1], probs=probs))    # 4 after 2: forbidden, kept as the last
    assert c.draft.tokens == [2, 4] and c.draft.probs.shape == (2, 6) and c.consumed == 1
    assert not c.masks[1][4] and c.masks[2].all()             # rejected for sure; the row after: unread


def test_a_tree_draft_falls_back_to_its_first_path():
    tree = Draft(tokens=[10, 11, 12, 13, 14], parents=[-1, -1, 0, 0, 2])
    assert first_path(tree).tokens == [10, 12, 14] and first_path(tree).parents is None
    g = Alternating(16)
    g.consume(1)
    assert constrain(g, tree).draft.tokens == [10]            # 12 after 10: forbidden


# -- the engine, on llguidance's grammars ----------------------------------------------------------
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path, _ = write_tiny_gguf(tmp_path_factory.mktemp("tok") / "q.gguf", "qwen2")
    return read_tokenizer(path)


@pytest.fixture(scope="module")
def grammars(tok):
    return Grammars(tok, tok.vocab_size)


class Noisy(Drafter):
    """Drafts a known answer with random wrong tokens in it (forbidden ones included), so the rounds
    accept, reject and cut drafts at every length. proposed: the draft tokens it proposed."""

    def __init__(self, answer: list[int], prompt_len: int, vocab: int, seed: int):
        self.answer, self.prompt_len, self.vocab, self.rng = answer, prompt_len, vocab, random.Random(seed)
        self.proposed = 0

    def reset(self):
        pass

    def propose(self, context, k, floors=()):
        at = len(context) - self.prompt_len
        out = [t if self.rng.random() < 0.8 else self.rng.choice([self.rng.randrange(self.vocab), *self.answer])
               for t in self.answer[at:at + k]]
        self.proposed += len(out)
        return Draft(tokens=out)

    def commit(self, accepted):
        pass


def tiny_engine(tok, grammars, draft_seed: int | None = None, noisy: Noisy | None = None, eos=None):
    model, args = tiny_model("qwen2", vocab=tok.vocab_size, seed=3)
    factories = {"ngram": lambda r: NgramDrafter(r.ngram), "ngram-tree": lambda r: NgramTreeDrafter(r.ngram)}
    if draft_seed is not None:
        dmodel, dargs = tiny_model("qwen2", vocab=tok.vocab_size, seed=draft_seed)
        dcache = KVCache(dargs, MAX_SEQ, extra=2 * MAX_K + 2)

        def draft(req):
            d = DraftModelDrafter(dmodel, dcache, req.sampling)
            d.reset()
            return d
        factories["draft"] = draft
    if noisy is not None:
        factories["noisy"] = lambda r: noisy
    eng = Engine(model, KVCache(args, MAX_SEQ, extra=MAX_K + 1), offered(factories),
                 tok.eos_ids if eos is None else eos, MAX_SEQ, grammars=grammars)
    return eng, args


def run(eng, **kw) -> Finished:
    with torch.no_grad():
        *_, done = eng.generate(GenerationRequest(**kw))
    return done


def schema_of(schema) -> Constraint:
    return Constraint("json_schema", json.dumps(schema))


@pytest.mark.parametrize("schema", [PERSON, FLAG, None], ids=["person", "flag", "json_object"])
def test_every_mode_emits_the_ids_of_constrained_greedy(tok, grammars, schema, one_thread):
    constraint = Constraint("json_schema", JSON_OBJECT) if schema is None else schema_of(schema)
    prompt = tok.encode('{"name": "bob", "age": 7, "tags": ["a", "bc"]} {"ok": true} {"name": "bob", "age"')
    eng, _ = tiny_engine(tok, grammars, draft_seed=5)
    ref = run(eng, prompt_ids=prompt, max_new_tokens=48, spec="off", constraint=constraint)
    assert ref.ids
    noisy = Noisy(ref.ids, len(prompt), tok.vocab_size, seed=1)
    eng, _ = tiny_engine(tok, grammars, draft_seed=5, noisy=noisy)
    for spec in ["ngram", "ngram-tree", "draft", "noisy", "auto"]:
        for k in (1, 3, 8):
            done = run(eng, prompt_ids=prompt, max_new_tokens=48, spec=spec, k=k, constraint=constraint)
            assert done.ids == ref.ids and done.finish_reason == ref.finish_reason, (spec, k)
    noisy.proposed = 0
    done = run(eng, prompt_ids=prompt, max_new_tokens=48, spec="noisy", k=8, constraint=constraint)
    assert noisy.proposed > done.stats.drafted >= done.stats.accepted > 0      # drafts cut, and accepted
    if schema is PERSON:                       # FLAG's text is forced but for one word: nothing to reject
        assert done.stats.drafted > done.stats.accepted


def test_the_grammar_ends_the_answer_when_the_json_closes(tok, grammars, one_thread):
    """FLAG's only texts are {"ok": true} and {"ok": false}: then the grammar allows nothing but EOS."""
    eng, _ = tiny_engine(tok, grammars)
    for spec in ["off", "ngram"]:
        done = run(eng, prompt_ids=tok.encode('{"ok": true}'), max_new_tokens=40, spec=spec, constraint=schema_of(FLAG))
        assert done.finish_reason == "stop" and json.loads(tok.decode(done.ids)) in ({"ok": True}, {"ok": False})


def test_max_tokens_before_the_json_closes_is_a_length_finish(tok, grammars, one_thread):
    eng, _ = tiny_engine(tok, grammars)
    done = run(eng, prompt_ids=tok.encode("{"), max_new_tokens=3, spec="ngram", constraint=schema_of(PERSON))
    assert done.finish_reason == "length" and len(done.ids) == 3
    assert tok.decode(done.ids).startswith("{")


def test_sampled_constrained_text_stays_inside_the_grammar(tok, grammars, one_thread):
    """Sampling draws from the masked distribution: whatever it draws, in every mode, the grammar allowed it."""
    eng, _ = tiny_engine(tok, grammars, draft_seed=5)
    for spec, seed in [("off", 1), ("draft", 2), ("ngram", 3), ("auto", 4)]:
        done = run(eng, prompt_ids=tok.encode('{"ok": false}'), max_new_tokens=40, spec=spec, k=4,
                   sampling=SamplingParams(temperature=1.0, seed=seed), constraint=schema_of(FLAG))
        assert done.finish_reason == "stop" and json.loads(tok.decode(done.ids)) in ({"ok": True}, {"ok": False})
        g = grammars(schema_of(FLAG))
        for t in done.ids:
            g.consume(t)                                  # raises if the grammar forbids one


def test_an_engine_without_grammars_refuses_a_constraint(tok):
    eng, _ = tiny_engine(tok, None)
    with pytest.raises(ValueError, match="grammar"):
        eng.generate(GenerationRequest(prompt_ids=[1, 2], constraint=schema_of(FLAG)))


def test_constrained_sequences_of_a_batch_equal_their_solo_runs(tok, grammars, one_thread):
    eng, args = tiny_engine(tok, grammars)
    prompt = tok.encode('{"name": "al", "age": 3, "tags": []} {"name": "al"')
    reqs = [GenerationRequest(prompt_ids=prompt, max_new_tokens=30, spec=spec, k=4, constraint=c)
            for spec, c in [("ngram", schema_of(PERSON)), ("off", None), ("auto", Constraint("json_schema", JSON_OBJECT)),
                            ("ngram-tree", schema_of(PERSON))]]
    with torch.no_grad():
        alone = [run(eng, **vars(r)) for r in reqs]
        batch = BatchEngine(eng, SlotCache(args, 3, MAX_SEQ + MAX_K + 1), chunk=8)
        seqs = [batch.submit(r) for r in reqs]
        while batch.busy:
            batch.step()
    for seq, ref in zip(seqs, alone):
        done = [e for e in seq.take() if isinstance(e, Finished)] or [seq.g.result()]
        assert seq.g.out == ref.ids and done[-1].finish_reason == ref.finish_reason
