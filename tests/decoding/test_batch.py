"""Continuous batching (decoding/batch.py): every sequence of a batch emits exactly what the same request
emits alone through `Engine` (the ids; with a seed, the samples; with the same prices, the same rounds),
whatever joins, leaves, cancels, prompt chunks and speculative modes surround it; on model-free oracles
over many random cases, and on a tiny real model whose kernels are batch-invariant."""

from __future__ import annotations

import random

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.models.args import ModelArgs
from speczoo.models.forward import EVERY_ROW, Packed, Readout
from speczoo.slots import SlotCache
from speczoo.decoding.batch import BatchEngine
from speczoo.decoding.pricing.batch_view import batch_view
from speczoo.decoding.controller import Controller
from speczoo.decoding.pricing.cost import Costs, CvCurve, best_k
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.engine import MAX_K, Engine
from reference import HashOracle, MarkovOracle, OracleModel, OracleOut, TokenCache
from speczoo.decoding.round import Finished, Round
from speczoo.textgen import TextBatch, generate_text
from speczoo.tokenizer import Tokenizer
from speczoo.zoo.gguf_tokenizer import read_tokenizer
from tiny import tiny_model
from tiny_gguf import write_tiny_gguf
from offered import offered

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

DRAFTERS = {"ngram": lambda req: NgramDrafter(max_order=req.ngram),
            "ngram-tree": lambda req: NgramTreeDrafter(max_order=req.ngram)}
PRICED = Costs(cv=CvCurve.measured({1: 1.0, 2: 1.1, 3: 1.2, 5: 1.5, 9: 2.2, 17: 3.5}),
               draft_cost={"ngram": 0.0, "ngram-tree": 0.0}, round_overhead=0.02)
MAX_SEQ = 128


class SlotOracle:
    """An oracle behind the batched forward contract (Packed keys and dest): each row's token id is stored in the
    KV cache itself (layer 0, head 0, dim 0), so the SlotCache's truncate and compact move it as they
    move real K/V, and a row's context is exactly the cache rows it attends to, in order."""

    args = None

    def __init__(self, oracle):
        self.oracle = oracle
        self.forwards = 0

    @staticmethod
    def model_args(vocab: int) -> ModelArgs:
        return ModelArgs(arch="qwen2", vocab_size=vocab, dim=1, n_layers=1, n_heads=1, n_kv_heads=1,
                         head_dim=1, ffn_dim=1)

    def __call__(self, tokens, positions, kv, *, attend: Packed, readout: Readout = EVERY_ROW):
        store = kv.k[0][0, :, 0]                                   # [C] token ids as floats
        store[attend.dest] = tokens.float()
        contexts = []
        for i in range(tokens.shape[0]):
            ctx = store[attend.keys.slots(i)].long().tolist()
            assert int(positions[i]) == len(ctx) - 1, "a row's position must follow its own context"
            contexts.append(ctx)
        rows = range(len(contexts)) if readout.logit_rows is None else readout.logit_rows.tolist()
        self.forwards += 1
        return OracleOut(torch.stack([self.oracle.logits(contexts[r]) for r in rows]))


def solo(oracle, req: GenerationRequest, eos, costs) -> tuple[list[Round], Finished]:
    eng = Engine(OracleModel(oracle), TokenCache(MAX_SEQ + MAX_K + 1), offered(DRAFTERS), eos_ids=list(eos),
                 max_seq=MAX_SEQ, costs=costs)
    *rounds, done = eng.generate(req)
    return rounds, done


def oracle_batch(oracle, eos, costs, n_slots: int, chunk: int) -> BatchEngine:
    eng = Engine(SlotOracle(oracle), None, offered(DRAFTERS), eos_ids=list(eos), max_seq=MAX_SEQ, costs=costs)
    return BatchEngine(eng, SlotCache(SlotOracle.model_args(oracle.vocab), n_slots, MAX_SEQ + MAX_K + 1),
                       chunk=chunk)


def random_request(rng: random.Random, vocab: int) -> GenerationRequest:
    prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
    if rng.random() < 0.4:                                 # a prompt that repeats itself
        prompt = prompt[:rng.randint(1, len(prompt))] * rng.randint(2, 4)
    sampling = SamplingParams()
    if rng.random() < 0.4:
        sampling = SamplingParams(temperature=rng.choice([0.5, 1.0, 1.5]), top_k=rng.choice([0, 0, 3]),
                                  top_p=rng.choice([1.0, 1.0, 0.8]), seed=rng.randrange(10**6))
    return GenerationRequest(prompt_ids=prompt[:MAX_SEQ - 60], max_new_tokens=rng.randint(1, 50),
                             sampling=sampling, spec=rng.choice(["off", "ngram", "ngram-tree", "auto"]),
                             k=rng.choice([1, 2, 3, 4, 8]), ngram=rng.choice([1, 2, 3]))


def drive(batch: BatchEngine, joins: dict[int, list[GenerationRequest]], cancels: dict[int, int]):
    """Submit each request at its step, cancel the i-th submitted at step cancels[i]; run to the end.
    Returns per submitted request (request, its Rounds, its Finished or None when cancelled)."""
    runs: list[tuple] = []
    step = 0
    while step <= max(joins, default=0) or batch.busy:
        for req in joins.get(step, []):
            runs.append((req, batch.submit(req), []))
        for i, at in cancels.items():
            if at == step and i < len(runs):
                runs[i][1].cancel()
        for req, seq, events in runs:
            events += seq.take()
        batch.step()
        for req, seq, events in runs:
            events += seq.take()
        step += 1
        assert step < 5000, "the batch does not finish"
    out = []
    for req, seq, events in runs:
        assert seq.done
        done = events[-1] if events and isinstance(events[-1], Finished) else None
        out.append((req, [e for e in events if isinstance(e, Round)], done))
    return out


def check_against_solo(oracle, eos, costs, results) -> int:
    accepted = 0
    for req, rounds, done in results:
        solo_rounds, solo_done = solo(oracle, req, eos, costs)
        ids = sum((r.ids for r in rounds), [])
        if done is None:                                                  # cancelled: a prefix of solo
            assert ids == solo_done.ids[:len(ids)]
            continue
        assert done.ids == ids == solo_done.ids, f"{req}"
        assert done.finish_reason == solo_done.finish_reason
        if costs is None or (not req.sampling.greedy and req.sampling.seed is not None):
            assert rounds == solo_rounds, "the same prices must make the same rounds"
        accepted += done.stats.accepted
    return accepted


@pytest.mark.parametrize("costs", [None, PRICED], ids=["free", "priced"])
def test_every_sequence_of_a_random_batch_equals_its_solo_run(costs):
    rng = random.Random(22 if costs is None else 23)
    accepted = 0
    for case in range(300):
        vocab = rng.choice([2, 3, 5, 8, 20])
        oracle = (MarkovOracle(vocab, seed=rng.randrange(10**6)) if rng.random() < 0.5
                  else HashOracle(vocab, seed=rng.randrange(10**6), order=rng.choice([1, 2, 3])))
        eos = {rng.randrange(vocab)} if rng.random() < 0.2 else set()
        batch = oracle_batch(oracle, eos, costs, n_slots=rng.randint(1, 4), chunk=rng.choice([1, 3, 8, 64]))
        joins: dict[int, list] = {}
        n = rng.randint(1, 6)
        for _ in range(n):
            joins.setdefault(rng.choice([0, 0, 1, 2, 5, 9]), []).append(random_request(rng, vocab))
        cancels = {i: rng.randint(0, 12) for i in range(n) if rng.random() < 0.15}
        accepted += check_against_solo(oracle, eos, costs, drive(batch, joins, cancels))
    assert accepted > 500                       # the drafts were exercised


@pytest.mark.parametrize("costs", [None, PRICED], ids=["free", "priced"])
def test_sequences_that_share_a_prompt_prefix_reuse_it_and_equal_their_solo_runs(costs):
    """Prompts that start alike (a system prompt, an earlier turn) take the shared rows from the cache,
    from the slot's own earlier sequence or from another slot, and still emit their solo ids."""
    rng = random.Random(31 if costs is None else 32)
    reused = 0
    for case in range(150):
        vocab = rng.choice([3, 5, 8, 20])
        oracle = (MarkovOracle(vocab, seed=rng.randrange(10**6)) if rng.random() < 0.3      # a whole-context
                  else HashOracle(vocab, seed=rng.randrange(10**6), order=MAX_SEQ + MAX_K))    # hash sees every row
        batch = oracle_batch(oracle, set(), costs, n_slots=rng.randint(1, 4), chunk=rng.choice([1, 3, 8, 64]))
        heads = [[rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(2)]
        joins: dict[int, list] = {}
        for _ in range(rng.randint(2, 6)):
            req = random_request(rng, vocab)
            head = rng.choice(heads)[:rng.randint(1, 30)]
            req = GenerationRequest(prompt_ids=(head + req.prompt_ids)[:MAX_SEQ - 60], max_new_tokens=req.max_new_tokens,
                                    sampling=req.sampling, spec=req.spec, k=req.k, ngram=req.ngram)
            joins.setdefault(rng.choice([0, 0, 1, 3, 8, 20]), []).append(req)
        seqs = []
        submit = batch.submit
        batch.submit = lambda r: seqs.append(submit(r)) or seqs[-1]
        check_against_solo(oracle, set(), costs, drive(batch, joins, {}))
        reused += sum(s.reused for s in seqs)
    assert reused > 500                          # prefixes were taken from the cache


class SharedDraft(NgramDrafter):
    """A drafter whose factory hands out one shared state, as the draft model's one cache: building a
    new one takes the state over, and the old one must never draft again."""

    owner = [0]

    def __init__(self, order: int):
        super().__init__(max_order=order)
        self.owner[0] += 1
        self.me = self.owner[0]

    def propose(self, context, k, floors=()):
        assert self.me == self.owner[0], "two sequences drafted with the one shared draft cache"
        return super().propose(context, k, floors)


def test_the_draft_model_is_lent_to_one_greedy_auto_sequence_at_a_time():
    """The batch lends the drafter with one shared cache to the first greedy `auto` sequence admitted
    while nobody holds it, until it leaves; every sequence still emits its solo ids."""
    rng = random.Random(41)
    lent = 0
    for case in range(120):
        vocab = rng.choice([3, 5, 8])
        oracle = HashOracle(vocab, seed=rng.randrange(10**6), order=rng.choice([1, 2]))
        batch = oracle_batch(oracle, set(), PRICED, n_slots=rng.randint(1, 3), chunk=rng.choice([3, 64]))
        batch.engine = batch.engine.offer(*offered({"draft": lambda req: SharedDraft(req.ngram)}))
        batch.engine.costs = Costs(cv=PRICED.cv, draft_cost={**PRICED.draft_cost, "draft": 0.0}, round_overhead=0.02)
        seqs = []
        submit = batch.submit

        def watched(req):
            seqs.append(submit(req))
            return seqs[-1]

        batch.submit = watched
        joins: dict[int, list] = {}
        for _ in range(rng.randint(1, 5)):
            joins.setdefault(rng.choice([0, 0, 2, 6]), []).append(random_request(rng, vocab))
        results = drive(batch, joins, {})
        assert batch.lease is None                                           # given back
        holders = [s for s in seqs if "draft" in s.g.drafters]
        assert all(s.request.sampling.greedy and s.request.spec == "auto" for s in holders)
        lent += len(holders)
        for req, rounds, done in results:                                    # the ids of the solo engine
            solo_eng = Engine(OracleModel(oracle), TokenCache(MAX_SEQ + MAX_K + 1), offered(DRAFTERS), eos_ids=[],
                              max_seq=MAX_SEQ, costs=PRICED)
            assert done.ids == list(solo_eng.generate(req))[-1].ids
    assert lent > 30


def test_a_long_prompt_is_prefilled_in_chunks_while_the_others_decode():
    oracle = MarkovOracle(20, seed=4)
    batch = oracle_batch(oracle, set(), None, n_slots=2, chunk=4)
    short = batch.submit(GenerationRequest(prompt_ids=[1, 2], max_new_tokens=30))
    batch.step()                                                       # the short prompt's prefill
    long = batch.submit(GenerationRequest(prompt_ids=list(range(20)) * 4, max_new_tokens=3))
    for _ in range(10):
        batch.step()
        assert len(short.take()) == 1                                  # one round every step
        assert long.prefilling
    assert batch.rows == 4 + 1


def test_a_cancelled_sequence_frees_its_slot_at_the_next_step():
    batch = oracle_batch(MarkovOracle(20, seed=4), set(), None, n_slots=1, chunk=64)
    first = batch.submit(GenerationRequest(prompt_ids=[1, 2, 3], max_new_tokens=50))
    second = batch.submit(GenerationRequest(prompt_ids=[4, 5], max_new_tokens=2))
    batch.step()
    batch.step()
    assert second.slot == -1 and len(batch.waiting) == 1                 # first come, first served
    first.cancel()
    batch.step()
    assert first.done and first.slot == -1 and second.slot == 0
    assert not [e for e in first.take() if isinstance(e, Finished)]


def test_drafters_that_share_state_are_refused_in_a_batch():
    oracle = MarkovOracle(20, seed=4)
    batch = oracle_batch(oracle, set(), None, n_slots=1, chunk=8)
    batch.engine = batch.engine.offer(*offered({"draft": lambda req: NgramDrafter()}))
    with pytest.raises(ValueError, match="cannot run in a batch"):
        batch.submit(GenerationRequest(prompt_ids=[1], max_new_tokens=4, spec="draft"))
    assert batch.spec_modes == ["off", "ngram", "ngram-tree", "auto"]


def test_the_batch_view_is_the_solo_price_alone_and_grows_with_the_batch():
    assert batch_view(PRICED, 0, 0) is PRICED
    wide = [batch_view(PRICED, r, r, 9) for r in (1, 3, 7)]
    for a, b in zip(wide, wide[1:]):
        assert b.cv(5) >= a.cv(5)
    assert all(v.cv(1) == 1.0 for v in wide)
    flat = Costs(cv=1.0, draft_cost={"ngram": 0.0})
    assert batch_view(flat, 5, 5, 9).cv(9) == 1.0          # rows that cost nothing are free in a batch too


def test_speculation_shrinks_and_turns_off_as_the_batch_grows():
    """On a weight-bound curve (extra rows nearly free alone), the batch's other rows raise what this
    sequence's rows must earn: the best K falls with the batch, and a drafter that pays alone at α = 0.3
    does not beside 7 other sequences."""
    zen = Costs(cv=CvCurve.measured({1: 1.0, 2: 1.05, 3: 1.1, 5: 1.23, 9: 1.6, 17: 2.5, 33: 4.5}),
                draft_cost={"ngram": 0.0}, round_overhead=0.02)
    views = [batch_view(zen, r, r, 9) for r in (0, 1, 3, 7)]
    for alpha in (0.5, 0.7, 0.9):
        ks = [best_k(alpha, v.cv, 0.0, 8, v.round_overhead).k for v in views]
        assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1], (alpha, ks)
    alone, crowded = (Controller(c, ["ngram"]).rate("ngram", 1, alpha=0.3) for c in (views[0], views[-1]))
    assert alone > 1.0 > crowded


@pytest.mark.parametrize("arch", ["qwen2", "lfm2"])              # lfm2: a hybrid, its convolution state per slot
@pytest.mark.parametrize("backend", ["fp32-rows", "q8"])
def test_a_tiny_models_batch_equals_its_solo_runs(backend, arch):
    model, args = tiny_model(arch, backend=backend, seed=3)
    rng = random.Random(backend)
    reqs = [GenerationRequest(prompt_ids=[rng.randrange(16) for _ in range(n)] * 3, max_new_tokens=m, spec=spec,
                              k=4, sampling=s)
            for n, m, spec, s in [(7, 24, "ngram", SamplingParams()), (3, 16, "off", SamplingParams()),
                                  (11, 20, "ngram-tree", SamplingParams()),
                                  (5, 24, "auto", SamplingParams(temperature=0.8, seed=7))]]
    eng = Engine(model, KVCache(args, MAX_SEQ, extra=MAX_K + 1), offered(DRAFTERS), eos_ids=[], max_seq=MAX_SEQ)
    with torch.no_grad():
        alone = [list(eng.generate(r)) for r in reqs]
        batch = BatchEngine(eng, SlotCache(args, 3, MAX_SEQ + MAX_K + 1), chunk=6)
        results = drive(batch, {0: reqs[:2], 2: reqs[2:]}, {})
    for (req, rounds, done), ref in zip(results, alone):
        assert rounds == ref[:-1] and done.ids == ref[-1].ids


def test_gemma_cannot_batch():
    _, args = tiny_model("gemma3", backend="fp32-rows", seed=5)
    with pytest.raises(ValueError, match="sliding-window"):
        SlotCache(args, 2, 8)


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    path, _ = write_tiny_gguf(tmp_path_factory.mktemp("tok") / "q.gguf", "qwen2")
    return read_tokenizer(path)


def test_a_text_batch_streams_what_generate_text_streams(tok):
    """Each request's TokenEvents and DoneEvent from a TextBatch are those of generate_text alone,
    stop strings (found mid-round) included."""
    oracle = MarkovOracle(tok.vocab_size, seed=9)
    eos = tok.eos_ids

    def alone(req):
        eng = Engine(OracleModel(oracle), TokenCache(MAX_SEQ + MAX_K + 1), offered(DRAFTERS), eos_ids=eos,
                     max_seq=MAX_SEQ)
        return list(generate_text(eng, tok, req))

    rng = random.Random(5)
    reqs = []
    for spec in ["off", "ngram", "ngram-tree", "auto", "ngram", "off"]:
        req = GenerationRequest(prompt_ids=[rng.randrange(tok.vocab_size) for _ in range(rng.randint(2, 9))],
                                max_new_tokens=40, spec=spec, k=4)
        text = alone(req)[-1].text
        if len(text) > 8 and rng.random() < 0.7:
            req.stop = [text[len(text) // 2:len(text) // 2 + 3]]
        reqs.append(req)
    batch = TextBatch(oracle_batch(oracle, eos, None, n_slots=3, chunk=4), tok)
    got: dict = {}
    seqs = [batch.submit(r) for r in reqs]
    while batch.busy:
        for seq, events in batch.step():
            got.setdefault(seq, []).extend(events)
    for req, seq in zip(reqs, seqs):
        ref, events = alone(req), got[seq]
        assert events[:-1] == ref[:-1]
        a, b = events[-1], ref[-1]
        assert (a.finish_reason, a.text, a.ids, a.stats.new_tokens) == (b.finish_reason, b.text, b.ids, b.stats.new_tokens)
    assert any(r.stop for r in reqs) and any(got[s][-1].finish_reason == "stop" and r.stop for r, s in zip(reqs, seqs))
