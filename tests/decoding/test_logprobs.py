"""Log-probabilities of emitted tokens (decoding/logprobs.py, plumbed through round, engine and batch):
the same floats, bit for bit, whether a token came through speculation (chain or tree) or plain
decoding, alone or in a continuous batch, on tiny models whose kernels are batch-invariant; each equals
log_softmax of the target's own logits for the token after the same context; nothing is computed for
a request that does not ask."""

from __future__ import annotations

import random

import pytest
import torch

from offered import offered
from speczoo.cache import KVCache
from speczoo.decoding.batch import BatchEngine
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.engine import MAX_K, Engine
from speczoo.decoding.logprobs import row_logprobs
from speczoo.decoding.round import Finished, Round
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.slots import SlotCache
from tiny import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

DRAFTERS = {"ngram": lambda req: NgramDrafter(max_order=req.ngram),
            "ngram-tree": lambda req: NgramTreeDrafter(max_order=req.ngram)}
MAX_SEQ = 160
MODES = ["off", "ngram", "ngram-tree", "auto"]


def engine(backend: str, seed: int = 3):
    model, args = tiny_model("qwen2", backend=backend, seed=seed)
    return Engine(model, KVCache(args, MAX_SEQ, extra=MAX_K + 1), offered(DRAFTERS), eos_ids=[], max_seq=MAX_SEQ), args


def prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(16) for _ in range(9)] * 4            # repeats: prompt lookup gets accepted


def run(eng: Engine, req: GenerationRequest) -> tuple[list[Round], Finished]:
    with torch.no_grad():
        *rounds, done = eng.generate(req)
    return rounds, done


@pytest.mark.parametrize("backend", ["fp32-rows", "q8"])
def test_logprobs_are_the_same_floats_through_speculation_and_plain_decoding(backend):
    eng, _ = engine(backend)
    for seed in range(3):
        runs = {mode: run(eng, GenerationRequest(prompt_ids=prompt(seed), max_new_tokens=40, spec=mode, k=5,
                                                 logprobs=4))
                for mode in MODES}
        plain = runs["off"][1]
        assert len(plain.logprobs) == len(plain.ids) == 40
        assert [lp.id for lp in plain.logprobs] == plain.ids
        for mode, (rounds, done) in runs.items():
            assert done.ids == plain.ids, mode
            assert done.logprobs == plain.logprobs, mode                # exact floats, top lists included
            assert [lp for r in rounds for lp in r.logprobs] == done.logprobs
            assert all(len(r.logprobs) == len(r.ids) for r in rounds)
        for mode in ("ngram", "ngram-tree"):                              # speculation did carry tokens
            assert sum(r.accepted for r in runs[mode][0]) > 10, mode


def test_each_logprob_is_the_log_softmax_of_the_targets_row_for_that_context():
    eng, _ = engine("fp32-rows")
    req = GenerationRequest(prompt_ids=prompt(7), max_new_tokens=12, spec="ngram", k=4, logprobs=3)
    _, done = run(eng, req)
    ctx = list(req.prompt_ids)
    with torch.no_grad():
        for lp in done.logprobs:
            row = torch.log_softmax(eng.score(ctx).float(), -1)     # [V]
            assert lp.logprob == pytest.approx(row[lp.id].item(), abs=1e-5)
            assert lp.id == int(row.argmax())                        # greedy: the most likely token ...
            assert lp.top[0] == (lp.id, lp.logprob)                  # ... heads its own top list
            assert [t for t, _ in lp.top] == row.topk(3).indices.tolist()
            ctx.append(lp.id)


def test_a_sampled_tokens_logprob_is_under_the_raw_distribution():
    """temperature reshapes the draw, never the reported log-probability (vLLM's and OpenAI's convention)."""
    eng, _ = engine("fp32-rows")
    req = GenerationRequest(prompt_ids=prompt(2), max_new_tokens=10, spec="ngram", k=3, logprobs=0,
                            sampling=SamplingParams(temperature=1.5, seed=11))
    _, done = run(eng, req)
    ctx = list(req.prompt_ids)
    with torch.no_grad():
        for lp in done.logprobs:
            assert lp.top == ()
            assert lp.logprob == pytest.approx(torch.log_softmax(eng.score(ctx), -1)[lp.id].item(), abs=1e-5)
            ctx.append(lp.id)


def test_a_batch_reports_the_logprobs_of_each_sequence_run_alone():
    eng, args = engine("q8", seed=5)
    reqs = [GenerationRequest(prompt_ids=prompt(s), max_new_tokens=24, spec=mode, k=4, logprobs=2)
            for s, mode in enumerate(MODES)]
    alone = [run(eng, r)[1] for r in reqs]
    batch = BatchEngine(eng, SlotCache(args, 3, MAX_SEQ + MAX_K + 1), chunk=7)
    seqs = [batch.submit(r) for r in reqs]
    done: dict[int, Finished] = {}
    with torch.no_grad():
        while batch.busy:
            for seq in batch.step():
                for item in seq.take():
                    if isinstance(item, Finished):
                        done[seqs.index(seq)] = item
    for i, ref in enumerate(alone):
        assert done[i].ids == ref.ids and done[i].logprobs == ref.logprobs, reqs[i].spec


def test_nothing_is_computed_unless_asked():
    eng, _ = engine("fp32-rows")
    rounds, done = run(eng, GenerationRequest(prompt_ids=prompt(1), max_new_tokens=8, spec="ngram", k=4))
    assert done.logprobs is None and all(r.logprobs is None for r in rounds)
    with pytest.raises(ValueError, match="top logprobs"):
        eng.generate(GenerationRequest(prompt_ids=[1, 2], logprobs=21))


def test_row_logprobs_reads_the_rows_it_is_given():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    [a, b] = row_logprobs(logits, torch.tensor([1, 0]), [0, 2], top=2)
    assert a.id == 0 and a.top[0][0] == 0 and b.top == ((2, b.logprob), (1, pytest.approx(b.logprob - 1)))
    with pytest.raises(ValueError, match="rows for"):
        row_logprobs(logits, slice(0, 2), [0], top=0)


@pytest.mark.real
def test_the_real_05b_gives_the_same_floats_through_speculation_and_plain_decoding():
    """qwen2.5-coder-0.5b on its packed kernels (batch-invariant): ngram and auto against plain greedy."""
    from real_models import real_runtime

    rt = real_runtime(max_seq=1024)
    text = "def area(w, h):\n    return w * h\n\n# the same function, copied:\n"
    ids = rt.tokenizer.encode(text * 2)
    runs = {}
    with torch.no_grad():
        for mode in ("off", "ngram", "auto"):
            *rounds, done = rt.engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=40, spec=mode,
                                                                 logprobs=5))
            runs[mode] = rounds, done
    plain = runs["off"][1]
    assert len(plain.logprobs) == 40 and all(lp.top[0] == (lp.id, lp.logprob) for lp in plain.logprobs)
    for mode in ("ngram", "auto"):
        rounds, done = runs[mode]
        assert sum(r.accepted for r in rounds) > 5, mode
        assert done.ids == plain.ids and done.logprobs == plain.logprobs, mode
