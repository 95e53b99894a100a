"""The drafters bench (benchmarks/drafters.py: modes interleaved with greedy round by round, its variants
without guesses and without the EAGLE head) and the draft model's replay (benchmarks/draft_replay.py), on
a fake runtime and hand-made teachers."""

import pytest

def test_drafters_bench_rejects_an_unknown_prompt_before_loading_anything():
    from benchmarks import drafters
    with pytest.raises(ValueError, match="unknown built-in prompt 'nope'"):
        drafters.main(["qwen2.5-coder-1.5b", "--prompts", "verbatim,nope"])


def test_drafters_bench_interleaves_modes_and_checks_every_run():
    from fake_runtime import FakeRuntime

    from benchmarks.drafters import OFF, interleaved, paired_ratio

    rt = FakeRuntime()
    seen = []
    real = rt.generate

    tenants = []

    def spy(req):
        seen.append((req.spec, req.max_new_tokens))
        tenants.append(req.tenant)
        return real(req)

    rt.generate = spy
    res = interleaved(rt, rt.tokenizer.encode("hello"), ["ngram", "draft"], k=4, gen=20, runs=3)
    # no run reads a suffix memory another run wrote: auto must not copy an earlier round's answer
    assert len(set(tenants)) == len(tenants) and None not in tenants
    runs = [s for s, n in seen if n == 20]
    assert runs == ["off", "ngram", "draft", "ngram", "draft", "off", "draft", "off", "ngram"]   # rotating
    assert [s for s, n in seen if n != 20] == ["off", "ngram", "draft"]                          # warm-up
    assert all(len(r.tok_s) == 3 and r.lossless for r in res.values())
    assert paired_ratio(res["ngram"], res[OFF]) > 0


def test_auto_without_the_head_is_auto_with_the_eagle_drafters_left_out_for_its_runs_only():
    from fake_runtime import FakeRuntime

    from benchmarks.drafters import NOEAGLE, interleaved
    from speczoo.decoding.drafters.registry import BUILTIN
    from speczoo.decoding.engine import Engine

    rt = FakeRuntime()
    specs = [s.with_factory(lambda req: None) for s in BUILTIN]
    rt.engine = Engine(None, None, specs, [], 64)
    engine = rt.engine
    seen = []
    real = rt.generate

    def spy(req):
        seen.append((req.spec, tuple(n for n, s in rt.engine.drafters.items() if s.auto)))
        return real(req)

    rt.generate = spy
    res = interleaved(rt, rt.tokenizer.encode("hello"), ["auto", NOEAGLE], k=4, gen=20, runs=2)
    assert {s for s, _ in seen} == {"off", "auto"}
    # auto offers prompt lookup's tree too (where its matches branch: decoding/round.py `situations`)
    assert ("auto", ("ngram", "ngram-tree", "suffix", "draft", "eagle")) in seen
    assert ("auto", ("ngram", "ngram-tree", "suffix", "draft")) in seen
    assert rt.engine is engine and engine.drafters["eagle"].auto          # restored after each run
    assert res[NOEAGLE].lossless and len(res[NOEAGLE].tok_s) == 2


def test_draft_replay_charges_fixed_k_and_floors_as_the_engine_would():
    from benchmarks.draft_replay import Teacher, replay
    from speczoo.decoding.pricing.cost import Costs

    out = list(range(20))
    free = Costs(cv=1.0, draft_cost={"draft": 0.0})
    perfect = Teacher(out=out, guess=list(out), sure=[1.0] * 20)
    # K = 4, every token right: 4 rounds of 5 tokens (pending + 4), one verify each
    assert replay(perfect, free, 4, None) == pytest.approx(20 / 4)
    priced = Costs(cv=1.0, draft_cost={"draft": 0.5})
    assert replay(perfect, priced, 4, None) == pytest.approx(20 / (4 * (4 * 0.5 + 1.0)))
    unsure = Teacher(out=out, guess=list(out), sure=[0.5] * 20)
    # floors of 0.6: every round stops after its first token (accepted), so rounds of 2 tokens
    assert replay(unsure, priced, 4, (0.6, 0.6, 0.6)) == pytest.approx(20 / (10 * 1.5))
    wrong = Teacher(out=out, guess=[-1] * 20, sure=[1.0] * 20)
    assert replay(wrong, priced, 4, None) < 1 < replay(perfect, priced, 4, None)
