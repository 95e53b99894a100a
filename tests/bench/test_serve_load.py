"""The load figure of issue 7: concurrent streaming clients on one server, each answer equal to the
same request served alone (`speczoo.bench.serve_load`, `speczoo serve-load`). Fast on the fake runtime;
the figure itself on the pulled qwen2.5-coder-0.5b (marked `real`: 8 clients x 64 tokens)."""

from __future__ import annotations

import pytest

from fake_runtime import FakeRuntime
from real_models import real_runtime
from speczoo.bench.serve_load import LoadResult, StreamResult, load_prompt, run_serve_load


def test_load_on_the_fake_runtime_is_identical_and_counts_tokens():
    rt = FakeRuntime(delay=0.001, answer_words=60)
    res = run_serve_load(rt, clients=8, max_tokens=40, spec="ngram")
    assert res.ok and res.identical == 8 and res.clients == 8
    assert [t.completion_tokens for t in res.together] == [40] * 8 and res.tokens == 320
    assert len({tuple(r.request.prompt_ids) for r in rt.log}) == 8, "two clients asked the same"
    assert [r.request.spec for r in rt.log] == ["ngram"] * 16
    assert res.aggregate_tok_s == pytest.approx(320 / res.wall_seconds)
    text = "\n".join(res.lines())
    assert "SERVE-LOAD IDENTICAL 8/8 PASS" in text and "tok/s" in text


def test_a_different_answer_under_load_fails_the_check():
    def r(text):
        return StreamResult(text=text, finish_reason="length", completion_tokens=4, first_token_s=0.1,
                            seconds=1.0, keepalives=0)
    res = LoadResult(model="m", spec="off", max_tokens=4, alone=[r("a"), r("b")], together=[r("a"), r("c")],
                     wall_seconds=2.0)
    assert res.identical == 1 and not res.ok
    assert "SERVE-LOAD IDENTICAL 1/2 FAIL" in "\n".join(res.lines())
    assert res.aggregate_tok_s == 4.0 and res.alone_tok_s == 4.0


def test_prompts_are_distinct_for_any_number_of_clients():
    assert len({load_prompt(i) for i in range(20)}) == 20
    edits = {load_prompt(i, "code_edit") for i in range(20)}
    assert len(edits) == 20 and all("```" in p or "def " in p for p in edits)


def test_an_unknown_category_is_a_clear_error():
    with pytest.raises(ValueError, match="no built-in questions in category 'nope'; one of: verbatim"):
        load_prompt(0, "nope")


def test_the_command_prints_the_figure_and_refuses_zero_clients(monkeypatch, capsys):
    import speczoo.runtime
    from speczoo.cli import main

    rt = FakeRuntime(answer_words=30)
    monkeypatch.setattr(speczoo.runtime, "load_runtime", lambda *a, **kw: rt)
    assert main(["serve-load", "fake-model", "--clients", "3", "--max-tokens", "10", "--spec", "off"]) == 0
    out = capsys.readouterr().out
    assert "3 concurrent streaming clients on fake-model" in out and "IDENTICAL 3/3 PASS" in out
    assert main(["serve-load", "fake-model", "--clients", "0"]) == 2
    monkeypatch.setattr(speczoo.runtime, "load_runtime", lambda *a, **kw: FakeRuntime(max_seq=8192))
    assert main(["serve-load", "fake-model", "--clients", "2", "--max-tokens", "8", "--spec", "off,ngram",
                 "--category", "code_edit"]) == 0
    out = capsys.readouterr().out
    assert "built-in code_edit prompts" in out and "ngram/off aggregate at 2 clients: " in out


@pytest.mark.real
def test_eight_concurrent_clients_on_the_real_05b():
    res = run_serve_load(real_runtime(max_seq=1024), clients=8, max_tokens=64, spec="auto")
    print("\n".join(res.lines()))
    assert all(t.finish_reason in ("length", "stop") for t in res.together), "a client did not complete"
    assert res.identical == 8, "an answer under load differs from the same request served alone"
    assert res.tokens >= 8 * 32 and res.aggregate_tok_s > 0


def test_load_on_a_batching_server_is_identical_and_reuses_the_lone_answers():
    rt = FakeRuntime(delay=0.001, answer_words=60)
    first = run_serve_load(rt, clients=2, max_tokens=30, spec="ngram", parallel=4)
    res = run_serve_load(rt, clients=4, max_tokens=30, spec="ngram", parallel=4, alone=first.alone)
    assert first.ok and res.ok and res.identical == 4 and res.parallel == 4
    assert len(rt.log) == 2 + 2 + 2 + 4                    # the first two lone answers were not asked again
    assert "up to 4 batched" in "\n".join(res.lines()) and res.ttft[0] <= res.ttft[1]
