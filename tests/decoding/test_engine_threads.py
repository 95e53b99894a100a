"""The engine's output does not depend on the thread count, so speczoo/threads.py may change the count at
run time: tokens, log-probabilities and every logit of every target forward are bit-identical at 1, 2
and 3 threads (greedy, prompt-lookup chains and trees, sampled with a seed), alone and in a batch, and
when the count changes at every forward in the middle of a generation.

The tiny models run the compiled kernels (q4 linears, the compiled blocks) with dims wide enough that
each linear is split among the threads; the real 0.5B adds torch's own ops at full size (a 151,936-wide
vocabulary) and a draft model's forwards.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from offered import offered
from speczoo.cache import KVCache
from speczoo.decoding.batch import BatchEngine
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.engine import MAX_K, Engine
from speczoo.decoding.pricing.cost import Costs, CvCurve
from speczoo.decoding.round import Finished
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.slots import SlotCache
from reference import HashOracle, OracleModel, TokenCache, reference_greedy
from tiny import tiny_model

DRAFTERS = {"ngram": lambda req: NgramDrafter(max_order=req.ngram),
            "ngram-tree": lambda req: NgramTreeDrafter(max_order=req.ngram)}
MAX_SEQ = 160
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=7)


class Recording:
    """The target model, keeping a copy of the logits of every forward."""

    def __init__(self, model):
        self.model = model
        self.logits: list[torch.Tensor] = []

    def __call__(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        self.logits.append(out.logits.clone())
        return out


class EveryForward:
    """A thread steer that changes the count before every target forward: 1, 2, 3, 1, ... (forced switches,
    no timing), and puts the count back when the generation ends, as threads.Steer does."""

    def __init__(self, counts=(1, 2, 3)):
        self.cycle = itertools.cycle(counts)
        self.seen: list[int] = []
        self.before = 0
        self.begun = self.ended = 0

    def begin(self) -> None:
        self.begun += 1
        self.before = torch.get_num_threads()
        torch.set_num_threads(next(self.cycle))

    def timed(self, s: int, seconds: float) -> bool:
        self.seen.append(torch.get_num_threads())
        torch.set_num_threads(next(self.cycle))
        return True

    def end(self) -> None:
        self.ended += 1
        torch.set_num_threads(self.before)


class Unsettled:
    """A steer whose every other forward is a try of another count (not settled); it changes nothing."""

    def __init__(self):
        self.rows: list[int] = []
        self.begun = self.ended = 0

    def begin(self) -> None:
        self.begun += 1

    def timed(self, s: int, seconds: float) -> bool:
        self.rows.append(s)
        return len(self.rows) % 2 == 0

    def end(self) -> None:
        self.ended += 1


@pytest.fixture(autouse=True)
def keep_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(40) for _ in range(11)] * 3            # repeats: prompt lookup gets accepted


def engine(arch: str, steer=None) -> tuple[Engine, Recording]:
    model, args = tiny_model(arch, backend="q4", vocab=256, dim=128, ffn_dim=320)
    rec = Recording(model)
    eng = Engine(rec, KVCache(args, MAX_SEQ, extra=MAX_K + 1, dtype=torch.float16), offered(DRAFTERS),
                 eos_ids=[], max_seq=MAX_SEQ, steer=steer)
    return eng, rec


def request(spec: str, sampling: SamplingParams = SamplingParams()) -> GenerationRequest:
    return GenerationRequest(prompt_ids=prompt(1), max_new_tokens=40, spec=spec, sampling=sampling, logprobs=3)


def run(eng: Engine, rec: Recording, req: GenerationRequest):
    """(ids, logprobs, the logits of every target forward, draft tokens accepted) of one generation."""
    rec.logits.clear()
    with torch.no_grad():
        *rounds, done = eng.generate(req)
    assert isinstance(done, Finished)
    return done.ids, done.logprobs, list(rec.logits), sum(r.accepted for r in rounds)


CASES = [("off", SamplingParams()), ("ngram", SamplingParams()), ("ngram-tree", SamplingParams()),
         ("off", SAMPLED), ("ngram", SAMPLED)]


def same(a, b) -> bool:
    ids_a, lp_a, logits_a, _ = a
    ids_b, lp_b, logits_b, _ = b
    return (ids_a == ids_b and lp_a == lp_b and len(logits_a) == len(logits_b)
            and all(torch.equal(x, y) for x, y in zip(logits_a, logits_b)))


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
@pytest.mark.parametrize("spec,sampling", CASES)
def test_outputs_and_logits_do_not_depend_on_the_thread_count(arch, spec, sampling):
    eng, rec = engine(arch)
    results = []
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        results.append(run(eng, rec, request(spec, sampling)))
    assert all(same(r, results[0]) for r in results[1:])
    if spec == "ngram" and sampling.greedy:
        assert results[0][3] > 5, "prompt lookup should be accepted on a repeating prompt"


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
@pytest.mark.parametrize("spec,sampling", CASES)
def test_the_count_changed_at_every_forward_changes_nothing(arch, spec, sampling):
    torch.set_num_threads(1)
    fixed = run(*engine(arch), request(spec, sampling))
    steer = EveryForward()
    eng, rec = engine(arch, steer)
    torch.set_num_threads(2)
    switched = run(eng, rec, request(spec, sampling))
    assert same(switched, fixed)
    assert set(steer.seen) == {1, 2, 3}, "every count should have run some forwards"
    assert torch.get_num_threads() == 2, "the steer puts the count back when the generation ends"


def test_a_batch_under_switching_threads_equals_each_request_alone():
    model, args = tiny_model("qwen2", backend="q4", vocab=256, dim=128, ffn_dim=320)
    torch.set_num_threads(1)
    solo = Engine(model, KVCache(args, MAX_SEQ, extra=MAX_K + 1), offered(DRAFTERS), eos_ids=[], max_seq=MAX_SEQ)
    reqs = [GenerationRequest(prompt_ids=prompt(seed), max_new_tokens=24, spec=spec, logprobs=2)
            for seed, spec in ((1, "off"), (2, "ngram"), (3, "ngram"))]
    with torch.no_grad():
        alone = [list(solo.generate(r))[-1] for r in reqs]
    steer = EveryForward()
    eng = Engine(model, None, offered(DRAFTERS), eos_ids=[], max_seq=MAX_SEQ, steer=steer)
    batch = BatchEngine(eng, SlotCache(args, 3, MAX_SEQ + MAX_K + 1), chunk=6)
    torch.set_num_threads(2)
    handles = [batch.submit(r) for r in reqs]
    done: dict[int, Finished] = {}
    with torch.no_grad():
        while batch.busy:
            batch.step()
            for i, h in enumerate(handles):
                done.update({i: e for e in h.take() if isinstance(e, Finished)})
    for i, want in enumerate(alone):
        assert done[i].ids == want.ids and done[i].logprobs == want.logprobs, i
    assert set(steer.seen) == {1, 2, 3}
    assert steer.begun == steer.ended == batch.steps      # the count is set for each step, and put back
    assert torch.get_num_threads() == 2


def test_the_cost_meter_times_only_the_forwards_at_the_count_in_use():
    costs = Costs(cv=CvCurve.measured({1: 30.0, 2: 30.6, 3: 31.8, 5: 36.0, 9: 54.0}), draft_cost={"ngram": 0.0},
                  round_overhead=0.02, step_ms=30.0)
    base = HashOracle(30, seed=3)
    steer = Unsettled()
    eng = Engine(OracleModel(base), TokenCache(300), offered({"ngram": DRAFTERS["ngram"]}), [], 200, costs=costs,
                 steer=steer)
    *_, done = eng.generate(GenerationRequest(prompt_ids=[1, 2, 3] * 4, max_new_tokens=60, spec="ngram", k=4))
    assert done.ids == reference_greedy(base, [1, 2, 3] * 4, 60)
    assert steer.begun == steer.ended == 1
    assert len(steer.rows) == done.stats.rounds and sum(steer.rows) == done.stats.rounds + done.stats.drafted
    assert eng.meter.n_forwards == len(steer.rows) // 2


@pytest.mark.real
def test_the_real_05b_and_its_draft_do_not_depend_on_the_thread_count():
    """qwen2.5-coder-0.5b on its packed kernels, drafting for itself (no costs: every round drafts K):
    plain greedy, prompt lookup sampled (torch's ops over the whole vocabulary) and the draft
    model, each at 1 thread, at 2, and with the count changed at every target forward (the draft model's
    forwards run at whichever count is set then)."""
    from real_models import QWEN_NAME
    from speczoo.decoding.drafters.draft_model import make_draft_drafter
    from speczoo.runtime import load

    loaded = load(QWEN_NAME)
    rec = Recording(loaded.model)
    drafters = offered({"ngram": DRAFTERS["ngram"], "draft": make_draft_drafter(loaded, loaded, 512, head_vocab=None)})
    text = "def area(w, h):\n    return w * h\n\n# the same function, copied:\n"
    ids = loaded.tokenizer.encode(text * 2)

    def go(spec: str, sampling: SamplingParams, steer) -> tuple:
        eng = Engine(rec, KVCache(loaded.args, 512, extra=MAX_K + 1, dtype=torch.float16), drafters,
                     eos_ids=[], max_seq=512, steer=steer)
        return run(eng, rec, GenerationRequest(prompt_ids=ids, max_new_tokens=20, spec=spec, k=4, logprobs=3,
                                               sampling=sampling))

    for spec, sampling in (("off", SamplingParams()), ("ngram", SAMPLED), ("draft", SamplingParams())):
        torch.set_num_threads(1)
        one = go(spec, sampling, None)
        torch.set_num_threads(2)
        two = go(spec, sampling, None)
        switched = go(spec, sampling, EveryForward((1, 2)))
        assert same(two, one) and same(switched, one), (spec, sampling)
        if spec != "off":
            assert one[3] > 5, spec
