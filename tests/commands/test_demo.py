"""`speczoo demo` prints each prompt's result the moment it has it, then the summary table (fake runtime)."""

from types import SimpleNamespace

import pytest
from fake_runtime import FakeRuntime

from speczoo import cli
from speczoo.bench import ab
from speczoo.decoding.tuning import DRAFTING


@pytest.fixture
def fake_runtime(monkeypatch):
    loads = []      # (remeasure_costs, draft_vocab) of each load

    def load_runtime(target, draft=None, backend=None, max_seq=None, remeasure_costs=False,
                     draft_vocab=DRAFTING.head_vocab, kv_type="f16"):
        loads.append((remeasure_costs, draft_vocab))
        rt = FakeRuntime(name=target)
        rt.chat_ids = lambda messages: rt.tokenizer.encode(messages[0]["content"][:200])
        rt.target = SimpleNamespace(backend="fake")
        return rt

    monkeypatch.setattr("speczoo.runtime.load_runtime", load_runtime)
    monkeypatch.setattr(cli, "apply_threads", lambda n: 1)
    return loads


def test_each_prompt_is_printed_before_the_next_runs(fake_runtime, monkeypatch, capsys):
    seen_before = []
    real_run_ab = ab.run_ab

    def run_ab(*a, **kw):
        seen_before.append(capsys.readouterr().out)      # what the user had on screen when this prompt began
        return real_run_ab(*a, **kw)

    monkeypatch.setattr(ab, "run_ab", run_ab)
    rc = cli.main(["demo", "--only", "verbatim", "code_edit", "--gen", "8"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "speczoo demo: loading qwen2.5-coder-1.5b" in seen_before[0]
    assert "[1/2] verbatim reproduction" in seen_before[0] and "SPEC LOSSLESS" not in seen_before[0]
    assert "SPEC LOSSLESS 8/8 PASS" in seen_before[1] and "SPEC STATS" in seen_before[1]
    assert "[2/2] code edit" in seen_before[1]
    assert "SPEC LOSSLESS 8/8 PASS" in out and "speedup" in out and "code edit" in out   # then the table


def test_an_unknown_prompt_name_is_an_error(fake_runtime, capsys):
    assert cli.main(["demo", "--only", "verbatim", "poetry"]) == 2
    assert "poetry: no such built-in prompt" in capsys.readouterr().err


def test_it_reads_the_stored_cost_profile_unless_told_and_says_how_long_it_took(fake_runtime, capsys):
    """The demo prices speculation from the profile stored at the first run (no timing at every run);
    --remeasure-costs times it afresh. It prints its time to the first result and to the end."""
    assert cli.main(["demo", "--only", "verbatim", "code_edit", "--gen", "8"]) == 0
    out = capsys.readouterr().out
    first, done = out.index("speczoo demo: first result after "), out.index("speczoo demo: done in ")
    assert out.index("SPEC LOSSLESS") < first < out.index("[2/2] code edit") < done
    assert cli.main(["demo", "--only", "verbatim", "--gen", "8", "--remeasure-costs"]) == 0
    assert [remeasure for remeasure, _ in fake_runtime] == [False, True]


def test_one_short_warm_up_instead_of_one_per_prompt(fake_runtime, monkeypatch):
    """Warm-ups prefilled each whole prompt once more; one short warm-up on the first prompt's first ids
    takes the cold start off the first timed run, and the A/B runs without its own."""
    warm, ab_warmups = [], []
    real_request, real_run_ab = ab.run_request, ab.run_ab

    def run_request(rt, req):
        warm.append((len(req.prompt_ids), req.max_new_tokens, req.spec))
        return real_request(rt, req)

    def run_ab(*a, warmup=True, **kw):
        ab_warmups.append(warmup)
        return real_run_ab(*a, warmup=warmup, **kw)

    monkeypatch.setattr(ab, "run_request", run_request)
    monkeypatch.setattr(ab, "run_ab", run_ab)
    assert cli.main(["demo", "--only", "verbatim", "code_edit", "--gen", "8"]) == 0
    assert warm[0] == (32, 8, "ngram") and ab_warmups == [False, False]
    assert len(warm) == 1 + 2 * 2             # the warm-up, then each prompt's greedy and speculative run


def test_draft_vocab_reaches_the_runtime_and_zero_means_the_full_head(fake_runtime):
    assert cli.main(["demo", "--only", "verbatim", "--gen", "4", "--runs", "1"]) == 0
    assert cli.main(["demo", "--only", "verbatim", "--gen", "4", "--runs", "1", "--draft-vocab", "0"]) == 0
    assert cli.main(["demo", "--only", "verbatim", "--gen", "4", "--runs", "1", "--draft-vocab", "16384"]) == 0
    assert [vocab for _, vocab in fake_runtime] == [DRAFTING.head_vocab, None, 16384]
    with pytest.raises(SystemExit):
        cli.main(["demo", "--draft-vocab", "-1"])
