"""A state that is not only a KV cache, on the model-free oracle: a recurrent model (tests/reference.py
RecurrentModel, its state kept row by row in a StateCache) through the real engine with every drafter
(prompt lookup, its tree, a draft model, `auto`), as the target and as the draft. Its rollback must equal
recompute: after every round the cache's state is the state folded over the committed ids from scratch,
and the output is plain greedy's."""

import random

import pytest

from speczoo.errors import CacheFullError
from speczoo.request import GenerationRequest
from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.engine import Engine
from speczoo.decoding.round import Finished
from offered import offered
from reference import (HashOracle, NoisyOracle, OracleModel, RecurrentModel, RecurrentOracle, StateCache,
                       TokenCache, reference_greedy)

MODES = ["off", "ngram", "ngram-tree", "draft", "auto"]


def engine(target, draft, max_seq=200):
    """An engine over `target` (a RecurrentOracle runs as a RecurrentModel in a StateCache, any other oracle
    as an OracleModel) offering prompt lookup, its tree and a draft model over `draft` (likewise)."""
    def model_and_cache(oracle, capacity):
        if isinstance(oracle, RecurrentOracle):
            return RecurrentModel(oracle), StateCache(capacity)
        return OracleModel(oracle), TokenCache(capacity)

    draft_model, draft_cache = model_and_cache(draft, max_seq + 160)

    def draft_factory(req):
        d = DraftModelDrafter(draft_model, draft_cache, req.sampling)
        d.reset()
        return d

    drafters = {"ngram": lambda req: NgramDrafter(req.ngram), "ngram-tree": lambda req: NgramTreeDrafter(req.ngram),
                "draft": draft_factory}
    model, cache = model_and_cache(target, max_seq + 80)
    return Engine(model, cache, offered(drafters), [], max_seq)


class Misread(RecurrentOracle):
    """A draft that mostly agrees with a recurrent target: the same state, another token now and then."""

    def logits_after(self, state, last):
        out = super().logits_after(state, last)
        if state % 7 == 0:
            out[(state >> 5) % self.vocab] = 5.0
        return out


@pytest.mark.parametrize("pair", ["hybrid target, hybrid draft", "hybrid target, dense draft",
                                  "dense target, hybrid draft"])
def test_every_mode_equals_greedy_with_a_recurrent_state(pair):
    rng = random.Random(pair)
    accepted = dict.fromkeys(MODES, 0)
    for case in range(120):
        vocab = rng.choice([3, 8, 30])
        recurrent = RecurrentOracle(vocab, seed=case, mix=rng.choice([0.1, 0.5, 0.9]))
        if pair == "hybrid target, hybrid draft":
            target, draft = recurrent, Misread(vocab, seed=case, mix=recurrent.mix)
        elif pair == "hybrid target, dense draft":
            target, draft = recurrent, HashOracle(vocab, seed=case, order=1)
        else:
            target = HashOracle(vocab, seed=case, order=rng.choice([1, 2]))
            draft = RecurrentOracle(vocab, seed=case, mix=0.5)
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        if rng.random() < 0.3:
            prompt = prompt[:rng.randint(1, len(prompt))] * 3
        n, k = rng.randint(1, 60), rng.choice([1, 3, 8, 16])
        want = reference_greedy(target, prompt, n)
        eng = engine(target, draft)
        for mode in MODES:
            *_, done = eng.generate(GenerationRequest(prompt_ids=prompt, max_new_tokens=n, spec=mode, k=k))
            assert done.ids == want, f"case {case} {mode}"
            accepted[mode] += done.stats.accepted
    assert all(accepted[m] > 100 for m in MODES if m != "off"), accepted


@pytest.mark.parametrize("mode", MODES[1:])
def test_rollback_equals_recompute_of_the_recurrent_state(mode):
    """After every round (a verify of K + 1 rows, j accepted, the rest rolled back) the target's state is
    exactly the state folded over the committed ids one by one."""
    target = RecurrentOracle(8, seed=3, mix=0.5)
    eng = engine(target, NoisyOracle(HashOracle(8, seed=3, order=1), miss=0.5))
    prompt = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]
    committed, rolled = list(prompt), 0
    for ev in eng.generate(GenerationRequest(prompt_ids=prompt, max_new_tokens=80, spec=mode, k=6)):
        if isinstance(ev, Finished):
            break
        committed += ev.ids
        n = eng.cache.length
        assert n == len(committed) or (n == len(committed) - 1 and ev.drafted == 0)
        assert eng.cache.state == target.fold(committed[:n])
        rolled += ev.drafted - ev.accepted
    assert rolled > 10, "no draft token was ever rolled back"


def test_a_rollback_past_the_saved_states_is_refused():
    oracle = RecurrentOracle(8, seed=1)
    model, cache = RecurrentModel(oracle), StateCache(300, reach=20)
    import torch

    model(torch.arange(30) % 8, torch.arange(30), cache)
    cache.truncate(12)                         # within reach of the furthest row written (30)
    assert cache.state == oracle.fold((torch.arange(12) % 8).tolist())
    with pytest.raises(CacheFullError, match="no longer held"):
        cache.truncate(5)
    cache.truncate(0)                          # a fresh start needs no saved state
