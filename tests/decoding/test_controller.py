"""The adaptive controller, on synthetic acceptance streams (no models)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from speczoo.decoding.acceptance import AcceptanceEstimate
from speczoo.decoding.controller import NONE, Choice, Controller, Costs
from speczoo.decoding.tuning import Tuning
from speczoo.decoding.pricing.cost import CvCurve, best_k, speedup

LLAMA_15B = CvCurve.measured({1: 1.0, 2: 1.58, 3: 2.09, 5: 3.05, 9: 6.28, 17: 7.84})


def accepted_count(alpha: float, k: int, rng: random.Random) -> int:
    """A truncated geometric sample: draft tokens survive one by one with probability α."""
    a = 0
    while a < k and rng.random() < alpha:
        a += 1
    return a


def simulate(ctl: Controller, alphas: dict[str, float], rounds: int, seed: int = 0,
             empty: dict[str, float] | None = None) -> list[Choice]:
    """Drive the controller; `empty[d]` is the chance that drafter d has no candidate this round."""
    rng = random.Random(seed)
    choices = []
    for _ in range(rounds):
        c = ctl.choose()
        choices.append(c)
        if c.drafter == NONE:
            continue
        assert 1 <= c.k <= ctl.k_max
        if empty and rng.random() < empty.get(c.drafter, 0.0):
            ctl.update(c.drafter, 0, 0)
        else:
            ctl.update(c.drafter, c.k, accepted_count(alphas[c.drafter], c.k, rng))
    return choices


def optimistic(ctl: Controller, drafter: str) -> float:
    """The α `drafter` is chosen at this round: its estimate plus Tuning.explore standard errors."""
    return ctl._estimate(drafter).upper(ctl.tuning.explore, ctl.tuning.ceiling_alpha)


def test_estimate_is_unbiased_for_truncated_geometric():
    rng = random.Random(1)
    for alpha, k in [(0.6, 4), (0.9, 8), (0.3, 2)]:
        est = AcceptanceEstimate(half_life=1e9)
        drafted = accepted = 0
        for _ in range(4000):
            a = accepted_count(alpha, k, rng)
            est.update(k, a)
            drafted += k
            accepted += a
        assert est.alpha == pytest.approx(alpha, abs=0.02)
        # the naive accepted/drafted would be far off for truncated runs
        if alpha == 0.6:
            assert accepted / drafted < 0.4


def test_empty_draft_is_no_evidence():
    est = AcceptanceEstimate()
    est.update(4, 0)
    before = (est.alpha, est.trials)
    for _ in range(10):
        est.update(0, 0)
    assert (est.alpha, est.trials) == before


def test_high_alpha_cheap_drafts_pick_ngram_with_large_k():
    ctl = Controller(Costs(cv=1.0, draft_cost={"ngram": 0.0}), ["ngram"], k_max=8)
    choices = simulate(ctl, {"ngram": 0.9}, 200)
    tail = choices[-50:]
    assert sum(c.drafter == "ngram" for c in tail) == 50
    assert all(c.k >= 6 for c in tail if not c.probe)
    # with the measured llama.cpp 1.5B curve the best K is smaller but it still drafts
    ctl = Controller(Costs(cv=LLAMA_15B, draft_cost={"ngram": 0.0}), ["ngram"], k_max=8)
    tail = simulate(ctl, {"ngram": 0.95}, 200)[-50:]
    assert all(c.drafter == "ngram" and 2 <= c.k <= 8 for c in tail)


def test_low_alpha_picks_plain_decoding_but_reprobes():
    ctl = Controller(Costs(cv=1.3, draft_cost={"ngram": 0.0}), ["ngram"], k_max=8, tuning=Tuning(reprobe_every=16))
    choices = simulate(ctl, {"ngram": 0.1}, 640)
    tail = choices[-320:]
    probes = [c for c in tail if c.probe]
    # the periodic re-probes: an 8-token probe that finds nothing wastes c_v(9) - 1 = 0.3 steps; prompt
    # lookup drafts for free, so one per max(reprobe_every, 0.3 / Tuning.free_probe_budget) = 16 rounds
    period = ctl.probe_period("ngram")
    assert period == pytest.approx(max(16.0, 0.3 / Tuning().free_probe_budget))
    assert sum(c.drafter == NONE for c in tail) >= 320 - 2 * (320 / period + 1)
    assert 0.8 * 320 / period - 1 <= len(probes) <= 320 / period + 1   # a lucky probe's rounds delay the next
    assert sum(c.drafter == "ngram" and not c.probe for c in tail) <= len(probes)   # after lucky probes


@pytest.mark.parametrize("alpha_tenths,want", [(9, ("ngram", 8)), (1, (NONE, 0))])
def test_decision_on_known_estimates(alpha_tenths, want):
    ctl = Controller(Costs(cv=1.3, draft_cost={"ngram": 0.0}), ["ngram"], k_max=8, tuning=Tuning(half_life=1000))
    feed(ctl, "ngram", alpha_tenths)
    c = ctl.decide()
    assert (c.drafter, c.k) == want


def true_rate(choice: Choice, alphas: dict[str, float], costs: Costs) -> float:
    if choice.drafter == NONE:
        return 1.0
    return speedup(alphas[choice.drafter], choice.k, costs.cv, costs.draft_cost[choice.drafter])


def efficiency(choices: list[Choice], alphas: dict[str, float], costs: Costs) -> float:
    """Tokens per unit time achieved, relative to an oracle that knows every α."""
    oracle = max([1.0] + [best_k(alphas[d], costs.cv, costs.draft_cost[d]).speedup for d in alphas])
    return sum(true_rate(c, alphas, costs) for c in choices) / len(choices) / oracle


def feed(ctl: Controller, drafter: str, alpha_tenths: int, repeats: int = 20) -> None:
    """Exact evidence: K = 1 rounds, `alpha_tenths` accepted in every 10, spread out."""
    pattern = [1 if (i * alpha_tenths) % 10 < alpha_tenths else 0 for i in range(10)]
    assert sum(pattern) == alpha_tenths
    for _ in range(repeats):
        for a in pattern:
            ctl.update(drafter, 1, a)


@pytest.mark.parametrize("cv", [1.0, 1.3])
def test_draft_model_beats_weak_ngram(cv):
    costs = Costs(cv=cv, draft_cost={"ngram": 0.0, "draft": 0.3})
    ctl = Controller(costs, ["ngram", "draft"], k_max=8, tuning=Tuning(half_life=1000))
    feed(ctl, "ngram", 2)
    feed(ctl, "draft", 7)
    assert ctl.alpha("ngram") == pytest.approx(0.2, abs=0.01)
    assert ctl.alpha("draft") == pytest.approx(0.7, abs=0.01)
    c = ctl.decide()
    assert c.drafter == "draft" and 1 <= c.k <= 3, c


# The two closed loops below pit two drafters against each other on noisy estimates. Their "draft" is
# judged on every token (the product's draft model stops on its confidence), so a run of misses at α 0.7
# now and then writes it off until a probe; they probe every reprobe_every rounds (both probe budgets 1)
# to keep to that question. The default budget spaces a probe of this draft (3 tokens, 1.2 steps wasted
# at c_v 1.3) 154 rounds apart: see test_probes_are_spaced_by_their_waste.
CHEAP_PROBES = 1.0


def test_draft_model_beats_weak_ngram_in_closed_loop():
    # c_v 1.3: n-gram at α 0.2 is below break-even (0.96×); the draft at 0.3 per token and α 0.7: 1.15×
    costs = Costs(cv=1.3, draft_cost={"ngram": 0.0, "draft": 0.3})
    alphas = {"ngram": 0.2, "draft": 0.7}
    shares, effs = [], []
    for seed in range(3):
        ctl = Controller(costs, ["ngram", "draft"], k_max=8,
                         tuning=Tuning(probe_budget=CHEAP_PROBES, free_probe_budget=CHEAP_PROBES))
        choices = simulate(ctl, alphas, 600, seed=seed)
        tail = Counter(c.drafter for c in choices[-300:])
        shares.append(tail["draft"] / 300)
        effs.append(efficiency(choices[-400:], alphas, costs))
    assert sum(shares) / 3 >= 0.5, shares          # the most used option, though estimates are noisy
    assert min(effs) >= 0.88 and sum(effs) / 3 >= 0.92, effs


def test_close_calls_still_get_most_of_the_oracle_speed():
    # n-gram 1.25× vs draft 1.37×: estimates are noisy, but picking the wrong one costs little
    costs = Costs(cv=1.0, draft_cost={"ngram": 0.0, "draft": 0.3})
    alphas = {"ngram": 0.2, "draft": 0.7}
    for seed in range(3):
        cheap = Tuning(probe_budget=CHEAP_PROBES, free_probe_budget=CHEAP_PROBES)
        choices = simulate(Controller(costs, ["ngram", "draft"], tuning=cheap), alphas, 600, seed=seed)
        assert efficiency(choices[-400:], alphas, costs) >= 0.92


def test_regime_changes_keep_most_of_the_oracle_speed():
    # the text alternates between extractive (n-gram α 0.9) and free-form (α 0.05) every 100 rounds
    costs = Costs(cv=LLAMA_15B, draft_cost={"ngram": 0.0})
    ctl = Controller(costs, ["ngram"], k_max=8)
    rng = random.Random(0)
    got = best = 0.0
    for r in range(1000):
        alphas = {"ngram": 0.9 if (r // 100) % 2 == 0 else 0.05}
        c = ctl.choose()
        if c.drafter != NONE:
            ctl.update(c.drafter, c.k, accepted_count(alphas[c.drafter], c.k, rng))
        got += true_rate(c, alphas, costs)
        best += max(1.0, best_k(alphas["ngram"], costs.cv, 0.0).speedup)
    assert got / best >= 0.85


def test_strong_ngram_beats_draft_model():
    costs = Costs(cv=1.0, draft_cost={"ngram": 0.0, "draft": 0.3})
    ctl = Controller(costs, ["ngram", "draft"], k_max=8)
    tail = Counter(c.drafter for c in simulate(ctl, {"ngram": 0.85, "draft": 0.7}, 400)[-200:])
    assert tail["ngram"] >= 180, tail


def test_k_stays_within_bounds():
    for cv in (1.0, 1.3, LLAMA_15B):
        for alpha in (0.0, 0.3, 0.6, 0.99, 1.0):
            ctl = Controller(Costs(cv=cv, draft_cost={"ngram": 0.0, "draft": 0.2}), ["ngram", "draft"],
                             k_max=5, tuning=Tuning(reprobe_every=3))
            for c in simulate(ctl, {"ngram": alpha, "draft": alpha}, 60):
                assert (c.drafter == NONE and c.k == 0) or 1 <= c.k <= 5


def test_empty_ngram_drafts_do_not_switch_it_off():
    ctl = Controller(Costs(cv=1.3, draft_cost={"ngram": 0.0}), ["ngram"], k_max=8)
    choices = simulate(ctl, {"ngram": 0.8}, 300, empty={"ngram": 0.7})
    assert sum(c.drafter == "ngram" for c in choices[-100:]) == 100


def test_round_overhead_and_draft_cost_can_make_drafting_lose():
    costs = Costs(cv=1.0, draft_cost={"draft": 0.7}, round_overhead=0.2)
    ctl = Controller(costs, ["draft"], k_max=8)
    tail = simulate(ctl, {"draft": 0.6}, 200)[-100:]
    assert sum(c.drafter == NONE for c in tail) >= 90
    assert ctl.rate(NONE, 0) == 1.0


def test_construction_errors():
    with pytest.raises(ValueError, match="draft_cost has no entry"):
        Controller(Costs(cv=1.0, draft_cost={}), ["ngram"])
    with pytest.raises(ValueError, match="k_max must be >= 1"):
        Controller(Costs(cv=1.0, draft_cost={"ngram": 0.0}), ["ngram"], k_max=0)
    with pytest.raises(ValueError, match="unique"):
        Controller(Costs(cv=1.0, draft_cost={"a": 0.0}), ["a", "a"])
    with pytest.raises(ValueError, match=">= 0"):
        Costs(cv=1.0, draft_cost={"a": -1.0})
    ctl = Controller(Costs(cv=1.0, draft_cost={"a": 0.0}), ["a", NONE])
    with pytest.raises(ValueError, match="unknown drafter"):
        ctl.update("b", 1, 0)
    with pytest.raises(ValueError, match="accepted"):
        ctl.update("a", 2, 3)
    ctl.update(NONE, 0, 0)                                  # plain rounds may be reported


def test_no_probe_for_a_drafter_that_cannot_beat_the_current_choice():
    # a draft model this expensive cannot win even at α ≈ 1 against prompt lookup at α = 0.95
    ctl = Controller(Costs(cv=1.3, draft_cost={"ngram": 0.0, "draft": 0.9}), ["ngram", "draft"],
                     k_max=8, tuning=Tuning(reprobe_every=8))
    choices = simulate(ctl, {"ngram": 0.95, "draft": 0.95}, 200)
    assert sum(c.drafter == "draft" for c in choices[20:]) == 0
    # a cheap one could, so it keeps being probed, as often as a probe's waste allows (Tuning.probe_budget)
    ctl = Controller(Costs(cv=1.3, draft_cost={"ngram": 0.0, "draft": 0.05}), ["ngram", "draft"],
                     k_max=8, tuning=Tuning(reprobe_every=8))
    choices = simulate(ctl, {"ngram": 0.6, "draft": 0.3}, 400)
    probes = sum(c.probe and c.drafter == "draft" for c in choices)
    assert probes >= 400 / ctl.probe_period("draft") - 1 >= 3


def test_a_drafter_that_failed_once_early_is_tried_again_soon():
    ctl = Controller(Costs(cv=1.05, draft_cost={"draft": 0.3}), ["draft"], k_max=8,
                     tuning=Tuning(reprobe_every=16))
    first = ctl.choose()
    assert first.drafter == "draft"
    ctl.update("draft", first.k, 0)                      # an unlucky first round
    nxt = [ctl.choose() for _ in range(3)]
    assert any(c.drafter == "draft" and not c.probe for c in nxt)
    with pytest.raises(ValueError, match="explore"):
        Controller(Costs(cv=1.0, draft_cost={"draft": 0.3}), ["draft"], tuning=Tuning(explore=-1))


def test_a_lagging_draft_pays_for_its_catch_up():
    costs = Costs(cv=CvCurve.measured({1: 1.0, 2: 1.01, 3: 1.06, 5: 1.23, 9: 1.79, 17: 3.02}),
                  draft_cost={"ngram": 0.0, "draft": 0.28})
    ctl = Controller(costs, ["ngram", "draft"], k_max=8)
    feed(ctl, "draft", 9)                                  # judged at α = 0.9
    simulate(ctl, {"ngram": 0.7, "draft": 0.9}, 80)
    assert ctl.catch_up("draft", 0) == 0.0 and ctl.catch_up("ngram", 60) == 0.0
    assert ctl.catch_up("draft", 16) == pytest.approx(0.28 * (3.02 - 1.0))
    ctl.choose(situations={"ngram": None})               # prompt lookup has nothing this round
    assert ctl.decide({"draft": 0}).drafter == "draft"                     # in step: worth drafting
    # far behind (a catch-up of 0.28 × (3.02 × 81 / 17 − 1) ≈ 3.8 target steps, charged twice): not worth
    # it for one round, but against plain decoding it is spread over Tuning.spread_rounds rounds (below)
    assert ctl.rate("draft", ctl.plan("draft", lag=80).k, lag=80) < 1.0
    assert ctl.decide({"draft": 80}).drafter == "draft"
    assert ctl.decide({"draft": 1000}).drafter == NONE                    # hopelessly behind: a plain round


def test_a_lagging_draft_is_not_locked_out_by_plain_rounds():
    """Plain decoding would win only on the draft's catch-up, which each plain round makes dearer: the
    catch-up is spread over the rounds the draft then keeps the floor (Tuning.spread_rounds), so the draft
    takes the round. Where prompt lookup wins the round, the full catch-up stands."""
    costs = Costs(cv=CvCurve.measured({1: 1.0, 2: 1.01, 3: 1.06, 5: 1.23, 9: 1.79, 17: 3.02}),
                  draft_cost={"ngram": 0.0, "draft": 0.28}, round_overhead=0.02)
    ctl = Controller(costs, ["ngram", "draft"], k_max=8,
                     priors={"ngram": {"weak": 0.15, "long": 0.95}}, confident={"draft"},
          tuning=Tuning(reprobe_every=1000))
    rng = random.Random(5)
    for _ in range(60):                     # free-form text: prompt lookup mostly has no match
        c = ctl.choose(situations={"ngram": None})
        if c.drafting:
            ctl.update("draft", c.k, accepted_count(0.75, c.k, rng))
    assert 0.6 < ctl.alpha("draft") < 0.9
    lag = 12
    once = ctl.rate("draft", ctl.plan("draft", lag=lag).k, lag=lag)
    spread = ctl.rate("draft", ctl.plan("draft", lag=lag, spread=True).k, lag=lag, spread=True)
    assert once < 1.0 < spread
    t = ctl.tuning
    assert t.catch_up_weight * ctl.catch_up("draft", lag) / t.spread_rounds == pytest.approx(
        ctl._overhead("draft", lag, spread=True) - costs.round_overhead)
    assert ctl.choose({"draft": lag}, {"ngram": None}).drafter == "draft"
    assert ctl.decide(lags={"draft": lag}).drafter == "draft"
    # prompt lookup on a long agreeing match wins the round: the draft's lag is not spread
    assert ctl.choose({"draft": lag}, {"ngram": "long"}).drafter == "ngram"


def test_situations_keep_separate_estimates_seeded_by_priors():
    costs = Costs(cv=CvCurve.measured({1: 1.0, 2: 1.01, 3: 1.06, 5: 1.23, 9: 1.79, 17: 3.02}),
                  draft_cost={"ngram": 0.0, "draft": 0.28})
    priors = {"ngram": {"long": 0.95, "short": 0.15}}
    ctl = Controller(costs, ["ngram", "draft"], k_max=8, priors=priors, tuning=Tuning(reprobe_every=1000))
    assert ctl.alpha("ngram", "long") == pytest.approx(0.95)
    assert ctl.alpha("ngram", "short") == pytest.approx(0.15)
    assert ctl.alpha("ngram", "unheard-of") == pytest.approx(0.5)        # no prior: prior_alpha
    rng = random.Random(3)
    truth = {"long": 0.95, "short": 0.03}
    picks = Counter()
    for r in range(400):
        sit = "long" if r % 3 == 0 else "short"
        c = ctl.choose(situations={"ngram": sit})
        if r >= 100:
            picks[sit, c.drafter] += 1
        if c.drafting:
            alpha = truth[sit] if c.drafter == "ngram" else 0.75
            ctl.update(c.drafter, c.k, accepted_count(alpha, c.k, rng))
    # the draft model takes the short-match rounds, so prompt lookup is not judged there again
    assert ctl.alpha("ngram", "long") > 0.85 and ctl.alpha("ngram", "short") <= 0.15
    # deep prompt lookup after a long match, the draft model (mostly) after a short one
    assert picks["long", "ngram"] == 100
    assert picks["short", "draft"] >= 0.8 * 200
    long = ctl.choose(situations={"ngram": "long"})
    assert long.drafter == "ngram" and long.k >= 6
    # the update goes to the estimate of the situation the round was chosen in
    before = ctl.alpha("ngram", "short")
    ctl.choose(situations={"ngram": "long"})
    ctl.update("ngram", 8, 0)
    assert ctl.alpha("ngram", "short") == before and ctl.alpha("ngram", "long") < 0.95


def test_a_drafter_with_nothing_to_propose_is_not_chosen():
    ctl = Controller(Costs(cv=1.0, draft_cost={"ngram": 0.0, "draft": 0.3}), ["ngram", "draft"], k_max=4,
                     tuning=Tuning(reprobe_every=1))
    for _ in range(20):
        c = ctl.choose(situations={"ngram": None})
        assert c.drafter != "ngram"
        if c.drafting:
            ctl.update(c.drafter, c.k, c.k)
    assert ctl.choose(situations={"ngram": None, "draft": None}).drafter == NONE
    assert ctl.decide().drafter == NONE                             # the same round's situations hold


def test_situation_priors_must_be_probabilities():
    with pytest.raises(ValueError, match="situation priors"):
        Controller(Costs(cv=1.0, draft_cost={"ngram": 0.0}), ["ngram"], priors={"ngram": {"x": 1.0}})


def test_catch_up_is_charged_catch_up_weight_times():
    costs = Costs(cv=CvCurve.measured({1: 1.0, 2: 1.01, 3: 1.06, 5: 1.23, 9: 1.79, 17: 3.02}),
                  draft_cost={"ngram": 0.0, "draft": 0.28})
    once = Controller(costs, ["ngram", "draft"], k_max=8, tuning=Tuning(catch_up_weight=1.0))
    twice = Controller(costs, ["ngram", "draft"], k_max=8, tuning=Tuning(catch_up_weight=2.0))
    lag = 40
    extra = once.catch_up("draft", lag)
    base = speedup(0.8, 4, costs.cv, 0.28, 0.0)
    assert once.rate("draft", 4, 0.8, lag) == pytest.approx(speedup(0.8, 4, costs.cv, 0.28, extra))
    assert twice.rate("draft", 4, 0.8, lag) == pytest.approx(speedup(0.8, 4, costs.cv, 0.28, 2 * extra))
    assert twice.rate("draft", 4, 0.8, lag) < once.rate("draft", 4, 0.8, lag) < base
    assert twice.rate("draft", 4, 0.8, 0) == base                   # a drafter in step pays nothing extra
    with pytest.raises(ValueError, match="catch_up_weight"):
        Controller(costs, ["ngram", "draft"], tuning=Tuning(catch_up_weight=0.5))


def test_a_confident_drafter_drafts_to_k_max_with_cost_priced_floors():
    stop_rate = Tuning().stop_rate
    cv = {1: 1.0, 2: 1.02, 3: 1.06, 5: 1.22, 9: 1.79}
    costs = Costs(cv=cv, draft_cost={"ngram": 0.0, "draft": 0.25})
    alone = Controller(costs, ["draft"], k_max=6, confident={"draft"})
    feed(alone, "draft", 7)
    c = alone.choose()
    assert c.drafter == "draft" and c.k == 6
    curve = costs.cv
    assert c.floors == pytest.approx([stop_rate * (0.25 + curve(i + 2) - curve(i + 1)) for i in range(1, 6)])
    assert c.floors[0] < c.floors[-1]                      # deeper rows cost more to verify
    # beside prompt lookup the same: its floors end the chain, not the plan's K
    ctl = Controller(costs, ["ngram", "draft"], k_max=6, confident={"draft"})
    feed(ctl, "draft", 7)
    c = ctl.choose(situations={"ngram": None})            # prompt lookup has nothing this round
    assert c.drafter == "draft" and c.k == 6
    assert c.floors == pytest.approx([stop_rate * (0.25 + curve(i + 2) - curve(i + 1)) for i in range(1, 6)])
    n = ctl.choose(situations={"draft": None})             # the n-gram drafter has no confidence: no floors
    assert n.drafter in ("ngram", "none") and n.floors == ()
    assert Controller(costs, ["draft"], k_max=6).floors("draft", 6) == ()
    with pytest.raises(ValueError, match="confident"):
        Controller(costs, ["draft"], confident={"eagle"})


def test_floors_are_read_through_the_fit_of_the_confidences():
    """A draft model whose tokens the target keeps far more often than its confidence says gets floors its
    own product reaches sooner (the same chance to survive, on its own scale), one kept less often gets
    higher ones; a round without confidences (no floors were given) teaches the fit nothing."""
    costs = Costs(cv={1: 1.0, 2: 1.02, 3: 1.06, 5: 1.22, 9: 1.79}, draft_cost={"draft": 0.25})
    ctl = Controller(costs, ["draft"], k_max=6, confident={"draft"})
    honest = ctl.floors("draft", 6)
    ctl.update("draft", 4, 4)
    assert ctl.floors("draft", 6) == honest
    for _ in range(30):
        ctl.update("draft", 4, 4, confidences=[0.6] * 4)
    gamma = ctl.fits["draft"].exponent
    assert gamma < 0.5
    assert ctl.floors("draft", 6) == pytest.approx([f ** (1 / gamma) for f in honest])
    assert all(a < b for a, b in zip(ctl.floors("draft", 6), honest))
    strict = Controller(costs, ["draft"], k_max=6, confident={"draft"})
    for _ in range(30):
        strict.update("draft", 4, 0, confidences=[0.9] * 4)
    assert all(a > b for a, b in zip(strict.floors("draft", 6), honest))


def test_a_confident_drafter_drafts_up_to_k_max_under_its_floors_beside_prompt_lookup():
    """The draft model, chosen beside prompt lookup, may draft up to k_max from its first round on, however
    short its runs: its floors, not the plan's K, end its chain (docs/tuning.md, "deep chains")."""
    costs = Costs(cv={1: 1.0, 2: 1.02, 3: 1.06, 5: 1.22, 9: 1.79}, draft_cost={"ngram": 0.0, "draft": 0.25})
    ctl = Controller(costs, ["ngram", "draft"], k_max=6, confident={"draft"})
    feed(ctl, "draft", 7)
    assert ctl.plan("draft", optimistic(ctl, "draft")).k < 6          # the plan alone would stop short
    for _ in range(6):                                     # runs of one round, broken by something else
        c = ctl.choose(situations={"ngram": None})
        assert c.drafter == "draft" and c.k == 6 and len(c.floors) == 5
        ctl.update("draft", c.k, 1)
        ctl.choose(situations={"draft": None})


def test_a_confident_drafter_is_priced_by_what_its_rounds_yielded():
    """A drafter that drafts deep where it is sure and stops after one token where it is not (8 of 8, then 1
    of 1 rejected, over and over) yields more per round than a chain of its α would: the controller takes
    the better of the two, so such a drafter wins a round from prompt lookup in a situation whose rate lies
    between them; priced as a chain alone (a yield never used) it would lose it."""
    costs = Costs(cv={1: 1.0, 2: 1.02, 3: 1.06, 5: 1.22, 9: 1.79}, draft_cost={"ngram": 0.0, "draft": 0.25})

    def after_rounds(tuning: Tuning) -> Controller:
        ctl = Controller(costs, ["ngram", "draft"], k_max=8, confident={"draft"}, priors={"ngram": {"s": 0.43}},
                         tuning=tuning)
        for i in range(12):
            ctl.update("draft", *((8, 8), (1, 0))[i % 2])
        return ctl

    yielded, chain = after_rounds(Tuning()), after_rounds(Tuning(yield_rounds=10**6))
    assert yielded.alpha("draft") == pytest.approx(chain.alpha("draft"))
    per_round = yielded.yields["draft"]
    assert per_round.rate() > chain._optimistic_rate("draft", 0, False)
    situations = {"ngram": "s"}
    assert yielded.choose(situations=situations).drafter == "draft"
    assert chain.choose(situations=situations).drafter == "ngram"
    assert Controller(costs, ["ngram", "draft"]).yields == {}  # only a confident drafter has a yield


def test_a_lone_draft_model_missed_on_its_first_token_is_probed_again_soon():
    """Live on a Zen 3 a lone draft model whose first token of a verbatim answer missed sat out the
    whole answer (255 plain rounds): one judged token put its α at 0.33, its probes were spaced for a
    drafter known to be poor, and by then the lag it had gathered cost more than any probe could win. A
    drafter judged on fewer than Tuning.probe_evidence tokens is probed every reprobe_every rounds, and a
    lone drafter's catch-up is spread over the rounds it would keep the floor when asked whether it could
    win at all."""
    zen3 = {1: 1.0, 2: 1.08, 3: 1.15, 5: 1.42, 9: 2.32, 17: 4.33}
    t = Tuning()

    def first_probe(tuning: Tuning) -> tuple[int, int]:
        ctl = Controller(Costs(cv=zen3, draft_cost={"draft": 0.39}), ["draft"], k_max=8, confident={"draft"},
                         tuning=tuning)
        assert ctl.choose(lags={"draft": 1}).drafter == "draft"
        ctl.update("draft", 1, 0)                          # its first token missed
        for lag in range(500):                             # plain rounds: it falls behind by one id each
            c = ctl.choose(lags={"draft": lag})
            if c.drafter == "draft":
                assert c.probe
                return ctl.round, lag
        raise AssertionError("never probed again")

    rounds, _ = first_probe(t)
    assert rounds <= t.reprobe_every + 1
    later, lag = first_probe(Tuning(probe_evidence=0.0))   # spaced by its waste instead, yet still probed
    assert later > 4 * t.reprobe_every
    alone = Controller(Costs(cv=zen3, draft_cost={"draft": 0.39}), ["draft"], confident={"draft"})
    beside = Controller(Costs(cv=zen3, draft_cost={"draft": 0.39, "ngram": 0.0}), ["ngram", "draft"],
                        confident={"draft"})
    for ctl in (alone, beside):
        ctl.update("draft", 1, 0)
    assert alone.could_beat("draft", 1.0, lag) and not beside.could_beat("draft", 1.0, lag)


# -- the machine's costs, whatever they are: cheap or dear verify, cheap or dear draft -----------------

ZEN4 = CvCurve.measured({1: 1.0, 2: 1.01, 3: 1.06, 5: 1.23, 9: 1.79, 17: 3.02})


def test_probes_are_spaced_by_their_waste():
    """A probe that finds nothing emits one token for its round's cost: probes of a drafter judged on
    Tuning.probe_evidence tokens or more come every reprobe_every rounds while that waste is at most
    reprobe_every × Tuning.probe_budget, rarer beyond (before that, a drafter that drafts at a cost is
    probed every reprobe_every rounds)."""
    from speczoo.decoding.pricing.cost import round_cost

    for cv, step in ((ZEN4, 0.28), (ZEN4, 0.8), (LLAMA_15B, 0.35), (CvCurve.constant(1.0), 0.0)):
        ctl = Controller(Costs(cv=cv, draft_cost={"ngram": 0.0, "draft": step}, round_overhead=0.02),
                         ["ngram", "draft"], k_max=8)
        for d in ("ngram", "draft"):
            if d == "draft" and step > 0:                              # nothing known yet of one that lags
                assert ctl.probe_period(d) == ctl.tuning.reprobe_every
            for _ in range(8):
                ctl.update(d, 1, 0)                                    # now it has been judged: poor
            k = ctl.plan(d, ctl.tuning.probe_alpha).k
            cost = step if d == "draft" else 0.0
            waste = round_cost(k, cv, cost, 0.02) - 1.0
            t = Tuning()
            budget = t.free_probe_budget if cost == 0.0 else t.probe_budget   # prompt lookup drafts for free
            assert ctl.probe_period(d) == pytest.approx(max(16.0, waste / budget))
    cheap = Controller(Costs(cv=ZEN4, draft_cost={"ngram": 0.0}, round_overhead=0.02), ["ngram"])
    dear = Controller(Costs(cv=LLAMA_15B, draft_cost={"ngram": 0.0}, round_overhead=0.02), ["ngram"])
    for ctl in (cheap, dear):
        for _ in range(8):
            ctl.update("ngram", 1, 0)
    assert cheap.probe_period("ngram") == 16                    # a 4-token probe: 0.25 steps
    assert dear.probe_period("ngram") > 40                      # a 2-token probe: 1.1 steps
    with pytest.raises(ValueError, match="probe_budget"):
        Controller(Costs(cv=1.0, draft_cost={"ngram": 0.0}), ["ngram"], tuning=Tuning(probe_budget=0.0))


@pytest.mark.parametrize("cv,step", [(LLAMA_15B, 0.35), (ZEN4, 0.8), (CvCurve.constant(1.3), 0.3)],
                         ids=["dear-verify", "dear-draft", "flat-1.3"])
def test_drafters_that_cannot_pay_cost_under_four_percent(cv, step):
    """Prompt lookup at α 0.1 and a draft model at α 0.3 (prompt lookup just pays where a verify is
    cheap). Their tests and probes together cost under 4% against plain decoding; before the probes were
    spaced by their waste and K planned on what is known, 8-10% at a dear verify and at c_v 1.3. (Under
    3% with prompt lookup probed at Tuning.probe_budget too; Tuning.free_probe_budget pays ~1% here for
    finding the stretches of copied text again on a live AVX2 run: docs/tuning.md.)"""
    costs = Costs(cv=cv, draft_cost={"ngram": 0.0, "draft": step}, round_overhead=0.02)
    alphas = {"ngram": 0.1, "draft": 0.3}
    for seed in range(3):
        ctl = Controller(costs, ["ngram", "draft"], k_max=8)
        rng = random.Random(seed)
        tokens = time = 0.0
        for _ in range(600):
            c = ctl.choose()
            if c.drafter == NONE:
                tokens, time = tokens + 1, time + 1
                continue
            a = accepted_count(alphas[c.drafter], c.k, rng)
            ctl.update(c.drafter, c.k, a)
            tokens += a + 1
            time += c.k * costs.draft_cost[c.drafter] + costs.cv(c.k + 1) + costs.round_overhead
        assert tokens / time >= 0.96, (seed, tokens / time)


def test_k_is_planned_on_what_is_known_not_on_the_optimistic_bound():
    """Where a verify is dear, a deeper K is a bet on α: K maximizes the tokens expected over what is
    known of α (the estimate's posterior) per unit of the round's cost, not the optimistic bound's."""
    from speczoo.decoding.pricing.cost import expected_tokens, round_cost

    dear = Costs(cv=CvCurve.measured({1: 1.0, 2: 1.6, 3: 2.1, 5: 3.05, 9: 5.0, 17: 7.5}),
                 draft_cost={"ngram": 0.0}, round_overhead=0.02)
    ctl = Controller(dear, ["ngram"], k_max=8, tuning=Tuning(half_life=1e9, prior_alpha=0.8))
    feed(ctl, "ngram", 8, repeats=1)                      # α 0.8 on 10 tokens of evidence
    est = ctl._estimate("ngram")
    c = ctl.decide()
    known = [est.expected_tokens(k) / round_cost(k, dear.cv, 0.0, 0.02) for k in range(1, 9)]
    assert c.k == 1 + known.index(max(known)) == 2
    assert ctl.plan("ngram", optimistic(ctl, "ngram")).k == 3          # the optimistic plan bets deeper
    # the posterior's expected tokens: at least E at the estimate (E is convex in α), about it once known
    for k in (1, 3, 8):
        assert est.expected_tokens(k) >= expected_tokens(est.alpha, k) - 1e-12
    assert est.expected_tokens(1) == pytest.approx(1 + est.alpha)
    sure = AcceptanceEstimate(half_life=1e9, prior_alpha=0.7)
    for _ in range(2000):
        sure.update(1, 1)
        sure.update(1, 0)
    assert sure.expected_tokens(6) == pytest.approx(expected_tokens(sure.alpha, 6), rel=0.01)
    # where a verify is cheap the same evidence is drafted deeper
    cheap = Controller(Costs(cv=ZEN4, draft_cost={"ngram": 0.0}, round_overhead=0.02), ["ngram"], k_max=8,
                       tuning=Tuning(half_life=1e9, prior_alpha=0.8))
    feed(cheap, "ngram", 8, repeats=1)
    assert cheap.decide().k >= 4


def test_a_prior_alone_is_not_a_deep_bet_where_a_verify_is_dear():
    """A situation known only by its prior (0.95, two tokens' worth) has a posterior with most of its
    mass near 1; the plan takes it as worth Tuning.plan_evidence tokens, so it is not drafted 8 deep where a
    9-row verify costs 5 steps, and still is where a verify is cheap."""
    from speczoo.decoding.pricing.cost import expected_tokens

    dear = Costs(cv=CvCurve.measured({1: 1.0, 2: 1.6, 3: 2.1, 5: 3.05, 9: 5.0, 17: 7.5}),
                 draft_cost={"ngram": 0.0}, round_overhead=0.02)
    ctl = Controller(dear, ["ngram"], k_max=8, priors={"ngram": {"long": 0.95}}, tuning=Tuning(reprobe_every=1000))
    c = ctl.choose(situations={"ngram": "long"})
    est = ctl._estimate("ngram")
    assert est.expected_tokens(8) > est.expected_tokens(8, Tuning().plan_evidence) > expected_tokens(0.95, 8)
    assert ctl.plan("ngram", optimistic(ctl, "ngram")).k == 8           # the optimistic plan
    assert c.drafter == "ngram" and 3 <= c.k < 8
    cheap = Controller(Costs(cv=ZEN4, draft_cost={"ngram": 0.0}, round_overhead=0.02), ["ngram"], k_max=8,
                       priors={"ngram": {"long": 0.95}})
    assert cheap.choose(situations={"ngram": "long"}).k == 8


def test_catch_up_is_never_negative():
    """A noisy measured profile can put c_v(S) under 1; a catch-up still costs nothing less than zero."""
    costs = Costs(cv=CvCurve.measured({1: 1.0, 2: 0.95, 3: 0.89, 5: 0.89, 9: 0.89, 17: 0.89}),
                  draft_cost={"ngram": 0.0, "draft": 0.3})
    ctl = Controller(costs, ["ngram", "draft"], k_max=8)
    assert costs.cv(11) < 1.0
    assert ctl.catch_up("draft", 10) == 0.0
    assert ctl.decide({"draft": 10}).drafter in ("ngram", "draft", NONE)


def test_a_catch_up_is_spread_only_on_what_is_known():
    """Spreading a lagging draft's catch-up over the coming rounds (Tuning.spread_rounds) is a bet that it keeps
    the floor: made where its plan pays on what is known, not as a test on an optimistic α."""
    costs = Costs(cv=ZEN4, draft_cost={"ngram": 0.0, "draft": 0.28}, round_overhead=0.02)
    ctl = Controller(costs, ["ngram", "draft"], k_max=8, confident={"draft"}, tuning=Tuning(reprobe_every=1000))
    ctl.update("draft", 1, 1)                              # one hit: α 0.67 on three tokens' worth
    ctl.situations = {"ngram": None}
    est, lag = ctl._estimate("draft"), 76
    a = est.upper(ctl.tuning.explore, ctl.tuning.ceiling_alpha)
    assert ctl.rate("draft", ctl.plan("draft", a, lag, spread=True).k, a, lag, spread=True) > 1.0
    assert ctl._plan_known("draft", lag, spread=True)[1] < 1.0
    assert ctl.choose({"draft": lag}, {"ngram": None}).drafter == NONE
    c = ctl.choose({"draft": 20}, {"ngram": None})           # a shorter lag pays on what is known
    assert c.drafter == "draft" and c.k >= 2


# -- token trees: a tree drafter priced by its own trees' accepted tokens per node budget ------------------

ZEN4_15B = CvCurve.measured({1: 1.0, 2: 1.15, 3: 1.22, 5: 1.56, 9: 2.69, 17: 4.66})   # docs/results.md, quiet
DEAR = CvCurve.measured({1: 1.0, 2: 1.6, 3: 2.1, 5: 3.05, 9: 5.0, 17: 7.5})


def branching_rounds(alpha: float, sibling: float, k: int, rounds: int, seed: int = 0):
    """A recorded stream where the text branches at depth 1: per round, the chain drafts line A, whose
    tokens the target keeps one by one with probability α; the tree's nodes are A's first token (node 0),
    a sibling B (node 1), then A's continuation (nodes 2..k-1), and B is right in `sibling` of the rounds
    where A's first token is not. Yields (the chain's accepted, the tree's accepted path) per round."""
    rng = random.Random(seed)
    for _ in range(rounds):
        run = accepted_count(alpha, k, rng)
        path = [0] + list(range(2, min(k, run + 1))) if run else [1] if rng.random() < sibling else []
        yield run, path


def feed_branching(ctl: Controller, situation: str, alpha: float, sibling: float, rounds: int = 600) -> None:
    """Both prompt lookups judged on the same rounds of the stream (a recorded history, as the replay has)."""
    k = ctl.k_max
    for chain, path in branching_rounds(alpha, sibling, k, rounds):
        ctl.choose(situations={"ngram": situation, "ngram-tree": situation})
        ctl.update("ngram", k, chain, k, list(range(chain)))
        judged = len(path) + 1 if not path or path[-1] + 1 < k else len(path)
        ctl.update("ngram-tree", judged, len(path), k, path)


def tree_controller(cv) -> Controller:
    return Controller(Costs(cv=cv, draft_cost={"ngram": 0.0, "ngram-tree": 0.0}), ["ngram", "ngram-tree"],
                      k_max=8, trees={"ngram-tree"}, tuning=Tuning(reprobe_every=10_000, half_life=1e6))


def test_a_tree_is_chosen_where_its_branches_pay_and_a_chain_where_they_do_not():
    ctl = tree_controller(ZEN4_15B)
    feed_branching(ctl, "mixed", alpha=0.45, sibling=0.8)     # A's first token as often wrong as right; B catches most
    feed_branching(ctl, "agree", alpha=0.9, sibling=0.5)      # A nearly always right: node 1 is a wasted row
    mixed = ctl.choose(situations={"ngram": "mixed", "ngram-tree": "mixed"})
    assert mixed.drafter == "ngram-tree" and mixed.k == 2   # A and B: 1 + 0.45 + 0.55 × 0.8 tokens for c_v(3)
    assert ctl.rate("ngram-tree", 2) == pytest.approx((1 + 0.45 + 0.55 * 0.8) / ZEN4_15B(3), rel=0.05)
    assert ctl.rate("ngram-tree", 2) > 1.1 * max(ctl.rate("ngram", k) for k in range(1, 9))
    agree = ctl.choose(situations={"ngram": "agree", "ngram-tree": "agree"})
    assert agree.drafter == "ngram" and agree.k in (4, 5)


def test_where_every_row_is_dear_the_same_branches_do_not_pay():
    ctl = tree_controller(DEAR)
    feed_branching(ctl, "mixed", alpha=0.45, sibling=0.8)
    assert ctl.choose(situations={"ngram": "mixed", "ngram-tree": "mixed"}).drafter == NONE
def test_a_tree_drafter_is_tried_on_its_prior_and_its_rounds_need_their_paths():
    ctl = tree_controller(ZEN4_15B)
    ctl.choose(situations={"ngram": "s", "ngram-tree": "s"})
    # untried, a tree is priced as the chain at the same prior: the chain, listed first, wins the tie
    assert ctl.rate("ngram-tree", 4) == pytest.approx(ctl.rate("ngram", 4))
    with pytest.raises(ValueError, match="nodes and accepted path"):
        ctl.update("ngram-tree", 3, 1)
    with pytest.raises(ValueError, match="not among"):
        Controller(Costs(cv=1.0, draft_cost={"ngram": 0.0}), ["ngram"], trees={"ngram-tree"})
    with pytest.raises(ValueError, match="confidence"):
        Controller(Costs(cv=1.0, draft_cost={"draft": 0.3}), ["draft"], confident={"draft"}, trees={"draft"})
