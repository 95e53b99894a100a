"""Property test: the engine's speculative output equals plain greedy, token for token, on oracles."""

import random

import pytest

from speczoo.request import GenerationRequest
from speczoo.decoding.round import Finished
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.engine import Engine
from reference import (HashOracle, MarkovOracle, OracleModel, TokenCache,
                                    reference_greedy)
from offered import offered
from oracle_engines import random_case


def make_engine(oracle, max_seq=256, eos=()):
    model = OracleModel(oracle)
    drafters = {"ngram": lambda req: NgramDrafter(max_order=req.ngram)}
    eng = Engine(model, TokenCache(max_seq + 80), offered(drafters), eos_ids=list(eos), max_seq=max_seq)
    return eng, model


def run(eng, **kw):
    events = list(eng.generate(GenerationRequest(**kw)))
    done = events[-1]
    assert isinstance(done, Finished)
    assert sum((e.ids for e in events[:-1]), []) == done.ids
    return done


def test_spec_equals_greedy_3000_random_cases():
    rng = random.Random(1234)
    accepted_total = 0
    for case in range(3000):
        oracle, prompt, n, k, order, eos = random_case(rng)
        eng, model = make_engine(oracle, eos=eos)
        expected = reference_greedy(oracle, prompt, n, eos)
        spec = run(eng, prompt_ids=prompt, max_new_tokens=n, spec="ngram", k=k, ngram=order)
        assert spec.ids == expected, f"case {case}: k={k} order={order} prompt={prompt}"
        # one target forward per round, plus the prefill
        assert model.forwards == spec.stats.rounds + 1
        accepted_total += spec.stats.accepted
        if case % 10 == 0:
            plain = run(eng, prompt_ids=prompt, max_new_tokens=n, spec="off", k=k)
            assert plain.ids == expected
    assert accepted_total > 10_000      # the drafts were really exercised


def test_verbatim_repeat_needs_few_forwards():
    oracle = MarkovOracle(50, seed=3)
    prompt = reference_greedy(oracle, [7], 40)
    eng, model = make_engine(oracle)
    done = run(eng, prompt_ids=[7] + prompt, max_new_tokens=40, spec="ngram", k=8)
    assert done.ids == reference_greedy(oracle, [7] + prompt, 40)
    assert done.stats.rounds <= 40 / 3


def test_max_new_tokens_one_needs_no_forward_after_prefill():
    eng, model = make_engine(HashOracle(20))
    done = run(eng, prompt_ids=[1, 2, 3], max_new_tokens=1, spec="ngram")
    assert len(done.ids) == 1 and model.forwards == 1 and done.finish_reason == "length"


@pytest.mark.parametrize("kw,msg", [
    (dict(k=0), "K"), (dict(k=10_000), "K"), (dict(ngram=0), "n-gram"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(prompt_ids=[]), "empty"),
    (dict(max_new_tokens=10_000), "exceeds the context"), (dict(spec="bogus"), "not available"),
])
def test_bad_requests_raise_before_any_event(kw, msg):
    eng, model = make_engine(HashOracle(20))
    args = dict(prompt_ids=[1, 2], max_new_tokens=5, spec="ngram")
    args.update(kw)
    with pytest.raises(Exception, match=msg):
        eng.generate(GenerationRequest(**args))
    assert model.forwards == 0


def test_engine_asks_situations_and_never_asks_a_drafter_that_has_nothing():
    """Each round the engine asks every drafter's situation before the controller chooses; a drafter in
    situation None is not asked to propose, and the output stays the greedy one."""

    class Recorder(NgramDrafter):
        def __init__(self):
            super().__init__(max_order=2)
            self.asked, self.proposed_in = 0, []

        def situation(self, context):
            self.asked += 1
            self._last = super().situation(context)
            return self._last

        def propose(self, context, k, floors=()):
            self.proposed_in.append(self._last)
            return super().propose(context, k, floors)

    oracle = MarkovOracle(20, seed=5)
    rec = Recorder()
    eng = Engine(OracleModel(oracle), TokenCache(200), offered({"ngram": lambda req: rec}), eos_ids=[],
                 max_seq=120)
    prompt = [1, 2, 3, 4] + reference_greedy(oracle, [1, 2, 3, 4], 30)
    done = run(eng, prompt_ids=prompt, max_new_tokens=40, spec="ngram", k=4)
    assert done.ids == reference_greedy(oracle, prompt, 40)
    assert rec.asked >= done.stats.rounds - 1 and rec.proposed_in
    assert None not in rec.proposed_in


def test_auto_leaves_out_the_excluded_drafters_but_they_stay_usable_by_name():
    built = []

    def factory(name):
        def make(req):
            built.append(name)
            return NgramDrafter(max_order=req.ngram)
        return make

    oracle = MarkovOracle(20, seed=2)
    eng = Engine(OracleModel(oracle), TokenCache(200),
                 offered({"ngram": factory("ngram"), "ngram-tree": factory("ngram-tree")},
                         auto_excludes=frozenset({"ngram-tree"})), eos_ids=[], max_seq=120)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    done = run(eng, prompt_ids=prompt, max_new_tokens=20, spec="auto", k=4)
    assert done.ids == reference_greedy(oracle, prompt, 20) and built == ["ngram"]
    run(eng, prompt_ids=prompt, max_new_tokens=5, spec="ngram-tree", k=4)
    assert built == ["ngram", "ngram-tree"]
