"""Engines and random cases on oracle models, shared by the engine's tests (test_draft_model.py,
test_guess.py, test_spec_property.py, test_tree_engine.py). Imported by test files, never a test itself."""

from __future__ import annotations

import random

from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.engine import Engine
from speczoo.decoding.round import Finished
from speczoo.request import GenerationRequest
from offered import offered
from reference import HashOracle, MarkovOracle, OracleModel, TokenCache


def engine_with_draft(target_oracle, draft_oracle, max_seq=200, window=0):
    """(engine, target, draft model, draft cache): an engine offering prompt lookup and a draft model, both
    on oracles; window: the draft's catch-up window (DraftModelDrafter)."""
    draft_model = OracleModel(draft_oracle, gaps=window > 0)
    draft_cache = TokenCache(max_seq + 160)

    def factory(req):
        d = DraftModelDrafter(draft_model, draft_cache, req.sampling, window=window)
        d.reset()
        return d

    drafters = {"ngram": lambda req: NgramDrafter(req.ngram), "draft": factory}
    target = OracleModel(target_oracle)
    return Engine(target, TokenCache(max_seq + 80), offered(drafters), [], max_seq), target, draft_model, draft_cache


def generate(eng, **kw):
    """The Finished of one request through `eng` (GenerationRequest fields as keywords)."""
    *_, done = eng.generate(GenerationRequest(**kw))
    assert isinstance(done, Finished)
    return done


def random_case(rng: random.Random):
    """(oracle, prompt, new tokens, K, n-gram order, eos ids) of one random speculative case."""
    vocab = rng.choice([2, 3, 5, 8, 20, 50])
    oracle = (MarkovOracle(vocab, seed=rng.randrange(10**6)) if rng.random() < 0.5
              else HashOracle(vocab, seed=rng.randrange(10**6), order=rng.choice([1, 2, 3])))
    prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
    if rng.random() < 0.3:                               # a prompt that repeats itself
        prompt = prompt[: rng.randint(1, len(prompt))] * rng.randint(2, 4)
    n = rng.randint(1, 60)
    k = rng.choice([1, 2, 3, 4, 8])
    order = rng.choice([1, 2, 3])
    eos = {rng.randrange(vocab)} if rng.random() < 0.2 else set()
    return oracle, prompt, n, k, order, eos
