"""`speczoo demo` prints each prompt's result the moment it has it, then the summary table (fake runtime)."""

from types import SimpleNamespace

import pytest
from fake_runtime import FakeRuntime

from speczoo import cli
from speczoo.bench import ab


@pytest.fixture
def fake_runtime(monkeypatch):
    def load_runtime(target, draft=None, backend=None, max_seq=None, remeasure_costs=False, kv_type="f16"):
        rt = FakeRuntime(name=target)
        rt.chat_ids = lambda messages: rt.tokenizer.encode(messages[0]["content"][:200])
        rt.target = SimpleNamespace(backend="fake")
        return rt

    monkeypatch.setattr("speczoo.runtime.load_runtime", load_runtime)
    monkeypatch.setattr(cli, "apply_threads", lambda n: 1)


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
