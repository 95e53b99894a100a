"""The cost profile a runtime reads (decoding/pricing/profile.py): measured once, cached in the bundle, with the draft's
reduced-head step; the controller's draft cost comes from it. Measuring it says so on stderr and keeps
to a time budget even where every forward is slow."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny import tiny_model

from speczoo.decoding.pricing import profile as cv
from speczoo.decoding.drafters.draft_model import reduced_head
from speczoo.decoding.pricing.profile import PROFILE_SIZES, load_or_measure, profile_path, runtime_costs
from speczoo.runtime import LoadedModel


def head(model):
    """The reduced draft head of a tiny model: its first 128 ids (of 512)."""
    return reduced_head(model, 128)

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(autouse=True)
def unhurried(monkeypatch):
    """Tiny models time every size in well under a second, but a loaded machine can slow any forward
    many times over: only the tests of the budget itself keep to one."""
    monkeypatch.setattr(cv, "PRICING", dataclasses.replace(cv.PRICING, profile_budget_s=600.0))


def loaded(tmp_path: Path, name: str, backend: str, **over) -> LoadedModel:
    model, args = tiny_model("qwen2", backend=backend, vocab=512, **over)
    d = tmp_path / name
    d.mkdir()
    return LoadedModel(name=name, path=d, args=args, model=model, tokenizer=None, backend=backend)


def test_profile_is_measured_once_and_holds_the_draft_step(tmp_path, monkeypatch):
    m = loaded(tmp_path, "small", "q4")
    data = load_or_measure(m, draft_head=head)
    assert set(data["ms"]) == {"1", "2", "3", "5", "9", "17"} and data["cv"]["1"] == 1.0
    assert data["draft_ms"] > 0
    assert "interpolated" not in data and "draft_interpolated" not in data   # fast: every size timed
    assert json.loads(profile_path(m).read_text()) == data
    profile_path(m).write_text(json.dumps({**data, "draft_ms": 123.0}))
    assert load_or_measure(m, draft_head=head)["draft_ms"] == 123.0                  # read back, not re-measured
    assert load_or_measure(m, remeasure=True, draft_head=head)["draft_ms"] != 123.0  # measured afresh for this run ...
    assert load_or_measure(m, draft_head=head)["draft_ms"] == 123.0                  # ... without overwriting the stored one


def test_draft_cost_uses_the_reduced_head_step_when_profiled(tmp_path, monkeypatch):
    target, draft = loaded(tmp_path, "t", "q4"), loaded(tmp_path, "d", "q4")
    t = load_or_measure(target, draft_head=head)
    d = load_or_measure(draft, draft_head=head)
    costs, drafting = runtime_costs(target, draft, draft_head=head)
    assert costs.draft_cost == {} and abs(drafting.step - d["draft_ms"] / t["ms"]["1"]) < 1e-9
    profile_path(draft).write_text(json.dumps({k: v for k, v in d.items() if k != "draft_ms"}))
    assert abs(runtime_costs(target, draft, draft_head=head)[1].step - d["ms"]["1"] / t["ms"]["1"]) < 1e-9


def test_fp32_models_have_no_draft_step(tmp_path):
    assert "draft_ms" not in load_or_measure(loaded(tmp_path, "f", "fp32"), draft_head=head)


def test_draft_rows_curve_sizes_the_guesses(tmp_path, monkeypatch):
    """The draft's forward cost over S rows (reduced head) is profiled and reaches the drafter's guesses;
    a profile from before it falls back to the model's own c_v curve."""
    target, draft = loaded(tmp_path, "t", "q4"), loaded(tmp_path, "d", "q4")
    d = load_or_measure(draft, draft_head=head)
    assert set(d["draft_cv"]) == {"1", "2", "3", "5", "9"} and d["draft_cv"]["1"] == 1.0
    rows = runtime_costs(target, draft, draft_head=head)[1].rows
    assert rows(9) == d["draft_cv"]["9"]
    profile_path(draft).write_text(json.dumps({k: v for k, v in d.items() if k != "draft_cv"}))
    assert runtime_costs(target, draft, draft_head=head)[1].rows(9) == d["cv"]["9"]
    assert runtime_costs(target, draft_head=head)[1] is None


def test_measuring_announces_itself_once_and_why(tmp_path, capsys):
    m = loaded(tmp_path, "m", "fp32")
    load_or_measure(m, draft_head=head)
    err = capsys.readouterr().err
    assert "speczoo: timing m (fp32) once for its cost profile" in err and str(profile_path(m)) in err
    load_or_measure(m, draft_head=head)
    assert capsys.readouterr().err == ""                             # read back: nothing to say
    load_or_measure(m, remeasure=True, draft_head=head)
    assert "afresh" in capsys.readouterr().err


def test_a_slow_path_keeps_to_the_budget_and_fits_the_larger_sizes(tmp_path, monkeypatch, capsys):
    """Every forward costing 50 ms a row on the profile's clock (a scalar path in miniature): the full
    profile would take about 15 s; within a 1 s budget it times S = 1 and 3 only, right after the probe
    and without the prefill, and fits the rest on their line."""
    m = loaded(tmp_path, "slow", "q4")
    clock = [0.0]
    monkeypatch.setattr(cv, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    fast = m.model.forward
    rows = []

    def slow(tokens, *a, **kw):
        clock[0] += 0.05 * len(tokens)
        rows.append(len(tokens))
        return fast(tokens, *a, **kw)

    monkeypatch.setattr(m.model, "forward", slow)
    data = load_or_measure(m, budget_s=1.0, draft_head=head)
    assert clock[0] <= 1.0
    assert rows == [1, 1, 3, 1, 3, 1, 3, 1, 3, 1]      # cold, probe 1 and 3, then draft and target in turn
    assert [int(s) for s in data["ms"]] == PROFILE_SIZES and data["interpolated"] == [2, 5, 9, 17]
    assert data["draft_interpolated"] == [2, 5, 9] and set(data["draft_cv"]) == {"1", "2", "3", "5", "9"}
    assert data["cv"] == {str(s): float(s) for s in PROFILE_SIZES}      # 17 rows cost 17 steps here
    assert not profile_path(m).exists()                 # cut short: this run's only, measured again next time
    assert ("target c_v(2, 5, 9, 17) fitted; draft c_v(2, 5, 9) fitted, for this run only (not stored)"
            in capsys.readouterr().err)
    runtime_costs(m, m, draft_head=head)                # the controller reads a fitted profile as any other


def test_no_time_for_the_draft_head_leaves_its_step_out(tmp_path, monkeypatch, capsys):
    """A row that takes 40% of the budget: the target's S = 1 and 3 are timed all the same (one point
    cannot price the others), the draft gets no time and its step is left out, so the controller prices
    it as the full head's."""
    m = loaded(tmp_path, "slower", "q4")
    clock = [0.0]
    monkeypatch.setattr(cv, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    fast = m.model.forward

    def slow(tokens, *a, **kw):
        clock[0] += 0.4 * len(tokens)
        return fast(tokens, *a, **kw)

    monkeypatch.setattr(m.model, "forward", slow)
    data = load_or_measure(m, budget_s=1.0, draft_head=head)
    assert data["cv"] == {str(s): float(s) for s in PROFILE_SIZES} and "draft_ms" not in data
    assert "no time for the draft head" in capsys.readouterr().err and not profile_path(m).exists()
    assert runtime_costs(m, m, draft_head=head)[1].step == 1.0
