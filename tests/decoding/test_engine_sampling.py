"""End to end through the engine: speculative sampling emits the target's distribution exactly.

The verify rule has its own statistical test (test_verify_sampling.py); this one drives the whole
engine (prefill sample, draft-model and n-gram drafts, rollback, controller) on oracle models and
compares the joint distribution of the first three emitted tokens with the exact target joint.
"""

from collections import Counter

import pytest
import torch

from speczoo.request import GenerationRequest, SamplingParams
from speczoo.decoding.round import Finished
from speczoo.decoding.pricing.cost import Costs
from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.engine import Engine
from reference import HashOracle, NoisyOracle, OracleModel, TokenCache
from lossless_stats import PARAMS, PROMPT, V, chi_square_p, exact_joint
from offered import offered


@pytest.mark.parametrize("spec", ["off", "ngram", "draft", "draft-stops"])
def test_engine_sampling_matches_target_distribution(spec):
    # "draft-stops": a priced draft step gives the draft model confidence floors of 0.75, so it often
    # stops after its first sampled token (the stop reads only its own q; the output must not change)
    costs = Costs(cv=1.0, draft_cost={"ngram": 0.0, "draft": 0.5}) if spec == "draft-stops" else None
    spec = spec.split("-")[0]
    target = HashOracle(V, seed=11, order=2)
    draft_model = OracleModel(NoisyOracle(target, miss=0.4, seed=3))
    draft_cache = TokenCache(64)

    def draft_factory(req):
        d = DraftModelDrafter(draft_model, draft_cache, req.sampling,
                              torch.Generator().manual_seed(req.sampling.seed + 10_000))
        d.reset()
        return d

    drafters = {"ngram": lambda req: NgramDrafter(2), "draft": draft_factory}
    eng = Engine(OracleModel(target), TokenCache(64), offered(drafters), eos_ids=[], max_seq=32,
                 costs=costs)
    n, runs = 3, 8_000
    counts, accepted, drafted, rounds = Counter(), 0, 0, 0
    for seed in range(runs):
        req = GenerationRequest(prompt_ids=PROMPT, max_new_tokens=n, spec=spec, k=2,
                                sampling=SamplingParams(PARAMS.temperature, PARAMS.top_k, seed=seed))
        *_, done = eng.generate(req)
        assert isinstance(done, Finished) and len(done.ids) == n
        counts[tuple(done.ids)] += 1
        accepted += done.stats.accepted
        drafted += done.stats.drafted
        rounds += done.stats.rounds
    p = chi_square_p(counts, exact_joint(target, n), runs)
    assert p > 1e-3, f"{spec}: emitted joint differs from the target's (chi-square p={p:.2e})"
    if spec != "off":                        # drafts were really accepted along the way
        assert accepted > (runs // 4 if spec == "draft" else runs // 20)
    if costs is not None:                    # ... and some drafts really stopped short of K = 2
        assert rounds < drafted < 2 * rounds
