"""Prompt-lookup guesses inside the draft-model drafter (decoding/drafters/guess.py): the draft proposes the
very chain it would without them, in fewer forwards where the text copies itself; guesses are sized by
the draft's row costs and the rate at which it confirmed earlier guesses; the engine stays lossless."""

import random

import torch

from speczoo.request import SamplingParams
from speczoo.decoding.pricing.cost import Costs
from speczoo.decoding.pricing.cost import CvCurve
from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from speczoo.decoding.drafters.guess import Guesser
from speczoo.decoding.drafters.ngram import NgramIndex
from reference import MarkovOracle, NoisyOracle, OracleModel, TokenCache, reference_greedy

from oracle_engines import engine_with_draft, generate

FREE_ROWS = CvCurve.constant(1.0)           # rows cost nothing: guess whenever prompt lookup matches


def drafter(oracle, guesser=None, params=None, seed=0):
    gen = torch.Generator().manual_seed(seed) if params is not None else None
    return DraftModelDrafter(OracleModel(oracle), TokenCache(400), params, gen, guesser=guesser)


def test_ahead_looks_up_past_the_history():
    idx = NgramIndex(3)
    idx.extend([1, 2, 3, 4, 5, 9, 1, 2])
    assert idx.ahead([], 3) == ("2-3/agree", [3, 4, 5])        # the history alone ends in 1 2
    assert idx.ahead([3, 4], 2) == ("4-7/agree", [5, 9])       # ... continued by drafted ids 3 4
    assert idx.ahead([7], 2) == (None, [])                     # 7 never occurred


def test_guessed_chains_equal_plain_chains_in_fewer_forwards():
    rng = random.Random(3)
    saved = 0
    for case in range(150):
        vocab = rng.choice([6, 20])
        base = MarkovOracle(vocab, seed=case)
        oracle = NoisyOracle(base, miss=rng.choice([0.0, 0.2, 0.5]), seed=case)
        params = None if case % 3 else SamplingParams(temperature=1.0)
        plain, guessed = drafter(oracle, None, params, case), drafter(oracle, Guesser(FREE_ROWS, 8), params, case)
        ctx = [rng.randrange(vocab) for _ in range(rng.randint(1, 25))]
        for _ in range(6):
            k = rng.choice([1, 2, 5, 8])
            floors = tuple(rng.uniform(0.0, 0.6) for _ in range(rng.randint(0, k)))
            a, b = plain.propose(ctx, k, floors), guessed.propose(ctx, k, floors)
            assert a.tokens == b.tokens, f"case {case}"
            assert (a.probs is None) == (b.probs is None)
            if a.probs is not None:
                assert torch.equal(a.probs, b.probs)
            kept = rng.randint(0, len(a.tokens))
            ctx = ctx + a.tokens[:kept] + [int(base.logits(ctx + a.tokens[:kept]).argmax())]
        saved += plain.model.forwards - guessed.model.forwards
        # the cache holds the committed prefix it agrees with plus at most K-1 ids beyond the context
        assert guessed.cache.length - guessed.lag(ctx) <= len(ctx) + 7
    assert saved > 300


def test_a_copying_text_is_drafted_in_one_forward():
    base = MarkovOracle(30, seed=1)
    prompt = reference_greedy(base, [4], 40)           # a cycle: prompt lookup knows what comes next
    d = drafter(base, Guesser(FREE_ROWS, 8))
    d.prefill(prompt)
    before = d.model.forwards
    draft = d.propose(prompt, 8)
    assert draft.tokens == reference_greedy(base, prompt, 8)
    assert d.model.forwards - before == 1              # the step and 7 confirmed guesses together
    assert draft.work == 1.0                           # one forward over 8 rows, which cost nothing here
    rows = CvCurve.measured({1: 1.0, 9: 2.0})
    d = drafter(base, Guesser(rows, 8))
    d.prefill(prompt)
    assert d.propose(prompt, 8).work == rows(8)        # 1 + 7 rows: what the calibration prices a step from
    plain = drafter(base)
    plain.prefill(prompt)
    assert plain.propose(prompt, 8).work == 8.0        # one forward per token


def test_guesses_are_sized_by_row_costs_and_confirmations():
    steep = CvCurve.measured({1: 1.0, 2: 1.3, 3: 1.6, 5: 2.2, 9: 3.4})
    g = Guesser(steep, 8)
    history = list(range(12)) + list(range(12))          # ... 8 9 10 11 | 0 1 ... 11: an 8+ agreeing match
    deep = len(g.guess(history[:-5], [], 8))             # the history ends in 0 1 ... 6 after an earlier 0..11
    assert 1 <= deep < 8
    assert g.guess(history[:-5], [], 8) == [7, 8, 9, 10, 11, 0, 1, 2][:deep]
    for _ in range(30):                                  # the draft keeps refusing these guesses
        g.guess(history[:-5], [], 8)
        g.judge(deep, 0, censored=False)
    assert g.guess(history[:-5], [], 8) == []            # one row alone is now the cheaper way
    free = Guesser(FREE_ROWS, 8)
    assert len(free.guess(history[:-5], [], 8)) == 8     # as many as allowed
    assert Guesser(steep, 8).guess([5, 6, 7], [], 8) == []   # nothing to look up


def test_censored_guess_is_no_miss():
    g = Guesser(FREE_ROWS, 4)
    ctx = [1, 2, 3, 1, 2]
    assert g.guess(ctx, [], 4)
    est = g._judged
    g.judge(3, 2, censored=True)                         # the chain ended on the second guessed id
    assert (est.successes, est.trials) == (2.0, 2.0)
    assert g.guess(ctx, [], 4)
    g.judge(3, 1, censored=False)                        # agreed with one, then said something else
    assert est.trials > est.successes


def test_engine_with_guesses_equals_greedy():
    rng = random.Random(9)
    for case in range(200):
        vocab = rng.choice([5, 12, 40])
        base = MarkovOracle(vocab, seed=case)
        eng, target, dmodel, dcache = engine_with_draft(base, NoisyOracle(base, miss=rng.choice([0.0, 0.3, 0.8]),
                                                                         seed=case))
        rows = rng.choice([FREE_ROWS, CvCurve.measured({1: 1.0, 2: 1.05, 3: 1.2, 5: 1.8, 9: 3.0})])
        inner = eng.drafters["draft"]
        eng = eng.offer(inner.with_factory(lambda req, inner=inner.factory, rows=rows: _with_guesser(inner(req), rows)))
        if case % 2:
            eng.costs = Costs(cv=1.0, draft_cost={"ngram": 0.0, "draft": 0.3})
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        n, k = rng.randint(1, 60), rng.choice([1, 3, 8])
        done = generate(eng, prompt_ids=prompt, max_new_tokens=n, spec=rng.choice(["draft", "auto"]), k=k)
        assert done.ids == reference_greedy(base, prompt, n), f"case {case}"


def _with_guesser(d: DraftModelDrafter, rows) -> DraftModelDrafter:
    d.guesser = Guesser(rows, 8)
    return d
