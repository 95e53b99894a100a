"""Online cost calibration: running means of measured forwards and drafts, back into the controller's Costs."""

import dataclasses

import pytest
import torch

from speczoo.request import GenerationRequest
from speczoo.decoding.round import Finished
from speczoo.decoding.pricing.calibrate import CostMeter
from speczoo.decoding.pricing.cost import Costs
from speczoo.decoding.pricing.cost import CvCurve
from speczoo.decoding.tuning import PRICING
from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.engine import Engine
from reference import HashOracle, OracleModel, TokenCache, reference_greedy
from offered import offered

PROFILE = Costs(cv=CvCurve.measured({1: 30.0, 2: 30.6, 3: 31.8, 5: 36.0, 9: 54.0}),
                draft_cost={"ngram": 0.0, "draft": 0.25}, round_overhead=0.02, step_ms=30.0)


def test_without_observations_the_profile_stands():
    c = CostMeter(PROFILE).costs()
    assert [round(c.cv(s), 6) for s in (1, 2, 3, 5, 9)] == [1.0, 1.02, 1.06, 1.2, 1.8]
    assert c.draft_cost == pytest.approx({"ngram": 0.0, "draft": 0.25})
    assert c.step_ms == pytest.approx(30.0) and c.round_overhead == 0.02


def test_observed_forwards_and_drafts_replace_the_profile():
    m = CostMeter(PROFILE)
    for _ in range(5):
        m.forward(1, 0.020)                    # the machine got faster at one row ...
        m.forward(5, 0.040)                    # ... and slower at five
        m.draft("draft", 2, 0.016)             # 8 ms per drafted token
        m.draft("ngram", 4, 0.001)             # prompt lookup stays free
    c = m.costs()
    assert c.step_ms == pytest.approx(20.0)
    assert c.cv(5) == pytest.approx(2.0)
    assert c.draft_cost["draft"] == pytest.approx(0.4) and c.draft_cost["ngram"] == 0.0
    # an S never seen scales with its nearest seen neighbour: S = 9 as S = 5 did (40 / 36)
    assert c.cv(9) == pytest.approx(54.0 * 40 / 36 / 20)


def test_a_drafter_priced_out_in_a_bad_moment_gets_its_profile_price_back():
    """A draft timed slow once is priced slow; while it does not draft nothing times it again, so its
    evidence fades with the target's forwards and the profile's price stands again (the controller may
    then try it, and time it anew)."""
    m = CostMeter(PROFILE)
    for _ in range(5):
        m.forward(1, 0.030)
        m.draft("draft", 1, 0.030)            # a full target step per drafted token: priced out
    assert m.costs().draft_cost["draft"] == pytest.approx(1.0)
    for _ in range(40):
        m.forward(1, 0.030)                   # rounds without the draft model
    assert m.costs().draft_cost["draft"] == pytest.approx(1.0)     # still its own measurement
    for _ in range(200):
        m.forward(1, 0.030)
    assert m.costs().draft_cost["draft"] == pytest.approx(0.25)    # faded: the profile's price again
    m.draft("draft", 1, 0.0075)               # tried again, and timed anew
    m.draft("draft", 1, 0.0075)
    assert m.costs().draft_cost["draft"] < 0.5


def test_a_forward_size_priced_out_in_a_bad_moment_gets_its_profile_shape_back():
    """A depth is timed only when the controller drafts that deep: a 9-row verify timed slow in a bad moment
    would keep the chains short for good. Its evidence fades with the forwards of the other sizes, and then
    it is priced by the profile's shape, scaled by the size still timed (S = 5 here); timed anew, its own
    measurement stands again."""
    m = CostMeter(PROFILE)
    for _ in range(5):
        m.forward(5, 0.036)
        m.forward(9, 0.108)                   # twice the profile's 54 ms
    assert m.ms(9) == pytest.approx(108.0)
    for _ in range(40):
        m.forward(5, 0.036)                   # rounds 4 deep only
    assert m.ms(9) == pytest.approx(108.0)    # still its own measurement
    for _ in range(200):
        m.forward(5, 0.036)
    assert m.ms(9) == pytest.approx(54.0)     # faded: the profile's, at S = 5's measured pace (36 / 36)
    m.forward(9, 0.060)
    m.forward(9, 0.060)
    assert m.ms(9) == pytest.approx(60.0)     # timed anew, without the stale 108 ms in its mean


def test_one_seen_size_rescales_the_rest():
    m = CostMeter(PROFILE)
    m.forward(2, 0.0245)
    assert m.ms(2) == pytest.approx(30.6)      # one observation is not enough evidence yet
    m.forward(2, 0.0245)
    assert m.ms(2) == pytest.approx(24.5)
    assert m.ms(1) == pytest.approx(30.0 * 24.5 / 30.6)


def test_noise_never_makes_more_tokens_cheaper():
    m = CostMeter(PROFILE)
    for _ in range(3):
        m.forward(1, 0.031)
        m.forward(2, 0.029)
    c = m.costs()
    assert c.cv(2) == 1.0 and c.cv(3) >= 1.0
    assert all(c.cv(s) <= c.cv(s + 1) for s in range(1, 9))


def test_running_means_follow_the_machine():
    m = CostMeter(PROFILE, dataclasses.replace(PRICING, half_life=4))
    for _ in range(40):
        m.forward(1, 0.030)
    for _ in range(16):
        m.forward(1, 0.020)
    assert 20.0 < m.ms(1) < 21.0


def test_a_profile_without_step_ms_cannot_be_calibrated():
    with pytest.raises(ValueError, match="step_ms"):
        CostMeter(Costs(cv=1.0))


def test_the_engine_calibrates_its_controller_as_it_runs():
    base = HashOracle(30, seed=3)
    draft_model, draft_cache = OracleModel(base), TokenCache(300)

    def factory(req):
        d = DraftModelDrafter(draft_model, draft_cache, req.sampling)
        d.reset()
        return d

    drafters = {"ngram": lambda req: NgramDrafter(req.ngram), "draft": factory}
    eng = Engine(OracleModel(base), TokenCache(300), offered(drafters), [], 200, costs=PROFILE)
    *_, done = eng.generate(GenerationRequest(prompt_ids=[1, 2, 3], max_new_tokens=60, spec="draft", k=4))
    assert isinstance(done, Finished) and done.ids == reference_greedy(base, [1, 2, 3], 60)
    meter = eng.meter
    # the rounds were timed, at whatever widths they ran (plain rounds and one-token drafts here, or only
    # drafts: a perfect draft may keep the floor every round)
    assert sum(m.weight for m in meter.forwards.values()) > 10
    assert meter.drafts["draft"].weight >= 2                            # and the drafts
    costs = meter.costs()
    step = meter.ms(1)                   # its one-token forward as measured, or scaled from a width it saw
    assert step < 10.0                                                  # oracles run far faster than 30 ms
    assert costs.step_ms == pytest.approx(step)
    assert costs.draft_cost["draft"] == pytest.approx(meter.drafts["draft"].value / step)
    assert Engine(OracleModel(base), TokenCache(300), offered(drafters), [], 200).meter is None


def test_sampled_requests_decide_on_the_profile_so_a_seed_reproduces_its_text():
    from speczoo.request import SamplingParams

    base = HashOracle(30, seed=3)
    draft_model, draft_cache = OracleModel(base), TokenCache(300)

    def factory(req):
        gen = torch.Generator().manual_seed(req.sampling.seed or 0)
        d = DraftModelDrafter(draft_model, draft_cache, req.sampling, gen)
        d.reset()
        return d

    eng = Engine(OracleModel(base), TokenCache(300), offered({"draft": factory}), [], 200, costs=PROFILE)
    req = GenerationRequest(prompt_ids=[1, 2, 3], max_new_tokens=30, spec="draft", k=4,
                            sampling=SamplingParams(temperature=0.8, seed=5))
    *_, first = eng.generate(req)
    assert not eng.meter.forwards                     # nothing timed for the meter
    for _ in range(5):                                # whatever the meter holds meanwhile ...
        eng.meter.forward(2, 1.0)
        eng.meter.forward(1, 0.001)
        *_, again = eng.generate(req)
        assert again.ids == first.ids                 # ... the seed gives the same text
    unseeded = GenerationRequest(**{**req.__dict__, "sampling": SamplingParams(temperature=0.8)})
    before = {s: m.total for s, m in eng.meter.forwards.items()}
    *_, done = eng.generate(unseeded)                 # no seed, nothing to reproduce: it calibrates
    assert {s: m.total for s, m in eng.meter.forwards.items()} != before


def test_replacing_the_engines_costs_replaces_their_calibration():
    eng = Engine(OracleModel(HashOracle(10, seed=1)), TokenCache(50), [], [], 20, costs=PROFILE)
    first = eng.meter
    first.forward(1, 0.01)
    assert eng.meter is first
    eng.costs = None                                  # no cost model: nothing to calibrate
    assert eng.meter is None
    eng.costs = Costs(cv=1.0, draft_cost={}, step_ms=5.0)
    assert eng.meter is not first and not eng.meter.forwards


def test_a_draft_step_is_priced_per_unit_of_work_not_per_token():
    """A draft model fed guesses reports its forwards' work (Draft.work): 8 tokens from one 9-row forward
    that cost 2 steps price the step at half the seconds, not at an eighth."""
    m = CostMeter(PROFILE)
    for _ in range(4):
        m.draft("draft", 2.0, 0.016)
    assert m.costs().draft_cost["draft"] == pytest.approx(8.0 / 30.0)
