"""The draft-model drafter on oracle models: lossless, and its cache stays in step with the target."""

import math
import random

import pytest
import torch

from speczoo.decoding.controller import Controller
from speczoo.request import GenerationRequest
from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from reference import (HashOracle, MarkovOracle, NoisyOracle, OracleModel,
                                    TokenCache, reference_greedy)
from oracle_engines import engine_with_draft, generate


def test_draft_model_spec_equals_greedy_random_cases():
    rng = random.Random(7)
    for case in range(400):
        vocab = rng.choice([3, 10, 40])
        base = (MarkovOracle(vocab, seed=case) if case % 2 else HashOracle(vocab, seed=case, order=2))
        draft = NoisyOracle(base, miss=rng.choice([0.0, 0.2, 0.6, 1.0]), seed=case)
        eng, target, dmodel, dcache = engine_with_draft(base, draft)
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        n = rng.randint(1, 50)
        k = rng.choice([1, 2, 3, 5, 8])
        done = generate(eng, prompt_ids=prompt, max_new_tokens=n, spec="draft", k=k)
        assert done.ids == reference_greedy(base, prompt, n), f"case {case}"
        # the draft cache holds a prefix of the committed sequence plus at most K-1 unverified own tokens
        committed = prompt + done.ids
        common = 0
        while common < min(dcache.length, len(committed)) and dcache.slots[common] == committed[common]:
            common += 1
        assert dcache.length - common <= k - 1


def test_perfect_draft_accepts_everything():
    base = HashOracle(50, seed=3)
    eng, target, dmodel, _ = engine_with_draft(base, base)
    done = generate(eng, prompt_ids=[1, 2, 3], max_new_tokens=41, spec="draft", k=4)
    assert done.ids == reference_greedy(base, [1, 2, 3], 41)
    assert done.stats.accepted == done.stats.drafted
    assert done.stats.rounds == 8          # 1 + 8 rounds * (4 accepted + 1) = 41 tokens


def test_draft_feeds_only_new_tokens_after_full_accept():
    base = HashOracle(50, seed=4)
    model = OracleModel(base)
    cache = TokenCache(100)
    d = DraftModelDrafter(model, cache)
    ctx = [5, 6, 7]
    dr = d.propose(ctx, 4)
    assert cache.length == 3 + 3          # prompt + K-1 drafted tokens fed
    ctx2 = ctx + dr.tokens + [int(base.logits(ctx + dr.tokens).argmax())]   # all accepted + bonus
    d.commit(4)
    before = model.forwards
    d.propose(ctx2, 2)
    # one forward over the 2 unseen ids (last draft token + bonus), then 1 for the second draft step
    assert model.forwards - before == 2
    assert cache.slots[:len(ctx2)] == ctx2


def test_prefill_fills_the_draft_cache_so_the_first_proposal_is_cheap():
    base = HashOracle(50, seed=5)
    model = OracleModel(base)
    cache = TokenCache(100)
    d = DraftModelDrafter(model, cache)
    prompt = [3, 4, 5, 6, 7, 8]
    d.prefill(prompt)
    assert cache.slots == prompt[:-1]
    before = model.forwards
    draft = d.propose(prompt + [9], 3)
    # the last prompt id and a0 in one forward, then K-1 single steps
    assert model.forwards - before == 3 and cache.slots[:7] == prompt + [9]
    assert draft.tokens == DraftModelDrafter(OracleModel(base), TokenCache(100)).propose(prompt + [9], 3).tokens


def test_auto_falls_back_to_the_draft_when_prompt_lookup_has_nothing():
    """An n-gram round with no candidate is not wasted: the same round drafts with the next best drafter."""
    from speczoo.decoding.round import Round

    base = HashOracle(40, seed=5)
    eng, *_ = engine_with_draft(base, base)                 # a perfect draft model
    prompt = [1, 2, 3, 4, 5]
    events = list(eng.generate(GenerationRequest(prompt_ids=prompt, max_new_tokens=60, spec="auto", k=4)))
    done = events[-1]
    assert done.ids == reference_greedy(base, prompt, 60)
    rounds = [e for e in events if isinstance(e, Round) and e.ids]
    assert not [e for e in rounds if e.drafter == "ngram" and e.drafted == 0], "an empty n-gram round went undrafted"
    assert sum(e.drafter == "draft" for e in rounds) > 0


def test_lag_counts_the_ids_the_draft_has_not_seen():
    base = HashOracle(30, seed=2)
    draft = DraftModelDrafter(OracleModel(base), TokenCache(100))
    draft.reset()
    assert draft.lag([1, 2, 3]) == 2                  # nothing fed: all but the last id
    draft.prefill([1, 2, 3])
    assert draft.lag([1, 2, 3]) == 0
    d = draft.propose([1, 2, 3], 3)                  # feeds 3 and its own first two proposals
    ctx = [1, 2, 3] + d.tokens[:1] + [7, 8, 9]        # one proposal kept, then new text
    assert draft.lag(ctx) == len(ctx) - 1 - 4
    draft.propose(ctx, 1)                             # K = 1: feeds ctx, proposes without feeding it
    assert draft.lag(ctx + [5]) == 0                  # the last id is always fed with the proposal
    assert draft.lag(ctx + [5, 6]) == 1
    assert draft.lag([9, 9, 9, 9]) == 3               # another text altogether


def _kept(d: DraftModelDrafter) -> list[int]:
    """The ids of `d.fed` that have a cache row (those outside its holes)."""
    skipped = {i for at, count in d.holes for i in range(at, at + count)}
    return [t for i, t in enumerate(d.fed) if i not in skipped]


def test_a_windowed_catch_up_feeds_only_the_last_missed_ids_at_their_true_positions():
    base = HashOracle(30, seed=8)
    seen: list[list[int]] = []                    # each forward's positions

    class Spy(OracleModel):
        def __call__(self, tokens, positions, cache, **kw):
            seen.append(positions.tolist())
            return super().__call__(tokens, positions, cache, **kw)

    model = Spy(base, gaps=True)                  # asserts each chain's positions are one apart
    cache = TokenCache(200)
    d = DraftModelDrafter(model, cache, window=4)
    prompt = [1, 2, 3, 4, 5]
    d.prefill(prompt)                             # the prompt is fed whole, window or not
    assert cache.slots == prompt[:-1] and d.lag(prompt) == 0
    ctx = prompt + list(range(6, 26))             # prompt lookup copied 20 ids the draft did not see
    assert d.lag(ctx) == 4                        # only the window is priced
    before = model.forwards
    draft = d.propose(ctx, 1)
    assert model.forwards - before == 1           # one forward over the window and the last id
    assert seen[-1] == list(range(20, 25))        # at their positions in the text, not their slots
    assert cache.slots == prompt[:4] + ctx[-5:]   # ctx[4:-5] skipped: a hole, no rows
    assert d.holes == [(4, len(ctx) - 9)] and d.fed == ctx and _kept(d) == cache.slots
    assert d.lag(ctx + draft.tokens) == 0
    # a rollback into the hole (another continuation after ctx[:10]) keeps the rows before it
    other = ctx[:10] + [29, 28]
    d.propose(other, 2)
    assert d.fed[:12] == other and d.holes == [(4, 6)]          # the hole cut where the rollback cut
    assert cache.slots == prompt[:4] + [29, 28, d.fed[12]] == _kept(d)
    # rolled back before the hole: no hole is left
    d.propose(prompt[:3] + [7], 1)
    assert d.holes == [] and cache.slots[:4] == prompt[:3] + [7]


def test_a_windowed_catch_up_loses_nothing():
    """With a window the draft skips ids it missed, so its proposals change; the output never does."""
    rng = random.Random(11)
    for case in range(200):
        vocab = rng.choice([3, 10, 40])
        base = MarkovOracle(vocab, seed=case) if case % 2 else HashOracle(vocab, seed=case, order=2)
        draft = NoisyOracle(base, miss=rng.choice([0.0, 0.2, 0.6]), seed=case)
        window = rng.choice([1, 2, 4])
        eng, target, dmodel, dcache = engine_with_draft(base, draft, window=window)
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))] * rng.randint(1, 4)
        n = rng.randint(1, 60)
        spec = rng.choice(["draft", "auto"])
        done = generate(eng, prompt_ids=prompt, max_new_tokens=n, spec=spec, k=rng.choice([1, 3, 8]))
        assert done.ids == reference_greedy(base, prompt, n), f"case {case}"


class SureOracle:
    """Always proposes `len(ctx) % 7`, with probability SURE[len(ctx) - 3] (then 0.5 once past the list)."""
    SURE = [0.9, 0.8, 0.6, 0.99, 0.99]

    def logits(self, ctx):
        v = 10
        n = len(ctx) - 3
        p = self.SURE[n] if 0 <= n < len(self.SURE) else 0.5
        out = torch.zeros(v)
        out[len(ctx) % 7] = math.log(p / (1 - p) * (v - 1))     # softmax probability exactly p
        return out


def test_confidence_floors_stop_the_draft():
    # cumulative confidence 0.9, 0.72, 0.432: under floors of 0.5 the third token is the last drafted,
    # and the draft model runs only the forwards those three tokens needed
    model = OracleModel(SureOracle())
    d = DraftModelDrafter(model, TokenCache(100))
    assert d.propose([1, 2, 3], 5).tokens == [3, 4, 5, 6, 0]             # no floors: K tokens
    model = OracleModel(SureOracle())
    d = DraftModelDrafter(model, TokenCache(100))
    draft = d.propose([1, 2, 3], 5, floors=(0.5, 0.5, 0.5, 0.5))
    assert draft.tokens == [3, 4, 5] and model.forwards == 3
    assert DraftModelDrafter(OracleModel(SureOracle()), TokenCache(100)).propose(
        [1, 2, 3], 5, floors=(0.5,)).tokens == [3, 4, 5, 6, 0]          # no floor past the list's end
    assert DraftModelDrafter(OracleModel(SureOracle()), TokenCache(100)).propose(
        [1, 2, 3], 5, floors=(0.95,)).tokens == [3]


def test_a_draft_with_floors_gives_the_confidence_of_every_token():
    """With floors, each token comes with the probability the draft gave it (the last one too: the
    controller fits its floors to what the target kept of them); a cut draft keeps the ones of its tokens;
    without floors, none are computed."""
    draft = DraftModelDrafter(OracleModel(SureOracle()), TokenCache(100)).propose([1, 2, 3], 5, floors=(0.5,))
    assert draft.tokens == [3, 4, 5, 6, 0] and draft.confidences == pytest.approx(SureOracle.SURE)
    stopped = DraftModelDrafter(OracleModel(SureOracle()), TokenCache(100)).propose([1, 2, 3], 5, floors=(0.5,) * 4)
    assert stopped.confidences == pytest.approx(SureOracle.SURE[:3])
    assert stopped.truncated(2).confidences == pytest.approx(SureOracle.SURE[:2])
    assert DraftModelDrafter(OracleModel(SureOracle()), TokenCache(100)).propose([1, 2, 3], 5).confidences is None


def test_the_engine_fits_the_floors_to_what_the_target_kept():
    """Rounds of a priced draft model hand its confidences to the controller, whose fit of them then
    reads its floors (decoding/confidence.py); the output stays the target's greedy one."""
    from speczoo.decoding.pricing.cost import Costs
    from speczoo.decoding.round import Generation, run_round, verify_recorded
    from speczoo.decoding.policy import make_policy

    base = MarkovOracle(20, seed=3)
    prompt, n = [1, 2, 3, 4], 60
    out = reference_greedy(base, prompt, n)
    req = GenerationRequest(prompt_ids=prompt, max_new_tokens=n, spec="draft", k=6)
    drafter = DraftModelDrafter(OracleModel(NoisyOracle(base, miss=0.3, seed=3)), TokenCache(200))
    costs = Costs(cv=1.0, draft_cost={"draft": 0.2})
    g = Generation({"draft": drafter}, make_policy(req, {"draft": drafter}, costs), list(prompt), n)
    drafter.prefill(prompt)
    g.start(out[0])
    while g.finish is None:
        run_round(g, lambda g, p: verify_recorded(p, out, len(g.out)))
    fit = g.policy.fits["draft"]
    assert g.out == out and g.stats.drafted > 0
    assert fit.evidence > 5 and fit.exponent != 1.0
    assert g.policy.floors("draft", 3) == pytest.approx(
        [fit.floor(f) for f in Controller(costs, ["draft"], confident={"draft"}).floors("draft", 3)])


def test_confidence_stops_stay_lossless():
    """A priced draft step gives the draft model floors (it stops on low confidence); output unchanged."""
    from speczoo.decoding.pricing.cost import Costs

    rng = random.Random(11)
    short = 0
    for case in range(120):
        vocab = rng.choice([10, 40])
        base = MarkovOracle(vocab, seed=case)
        draft = NoisyOracle(base, miss=rng.choice([0.0, 0.3, 0.7]), seed=case)
        eng, *_ = engine_with_draft(base, draft)
        eng.costs = Costs(cv=1.0, draft_cost={"ngram": 0.0, "draft": rng.choice([0.1, 0.3, 0.6])})
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))]
        n, k = rng.randint(1, 40), rng.choice([2, 4, 8])
        done = generate(eng, prompt_ids=prompt, max_new_tokens=n, spec="draft", k=k)
        assert done.ids == reference_greedy(base, prompt, n), f"case {case}"
        short += done.stats.drafted < k * done.stats.rounds
    assert short > 30
