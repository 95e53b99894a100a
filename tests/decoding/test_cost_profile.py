"""The cost profile a runtime reads (decoding/pricing/profile.py): measured once, cached in the bundle under a key
(bundle, backend, kernel path, threads, format), with the draft's reduced-head step; the controller's draft
cost comes from it. Measuring it says so on stderr and keeps to a budget of the machine's own steps, capped
in seconds, even where every forward is slow; what the cap cut short is stored fitted, marked so."""

import dataclasses
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny import tiny_model

from speczoo.cache import KVCache
from speczoo.decoding.pricing import profile as cv
from speczoo.decoding.drafters.draft_model import reduced_head
from speczoo.decoding.pricing.profile import (PROFILE_SIZES, StepBudget, load_or_measure, profile_key, profile_path,
                                              runtime_costs)
from speczoo.decoding.tuning import DRAFTING
from speczoo.runtime import LoadedModel


def head(model, vocab=DRAFTING.head_vocab):
    """The reduced draft head of a tiny model: its first 128 ids (of 512) at the default size, else `vocab`."""
    return reduced_head(model, 128 if vocab == DRAFTING.head_vocab else vocab)

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(autouse=True)
def unhurried(monkeypatch):
    """Tiny models time every size in well under a second, but a loaded machine can slow any forward
    many times over: only the tests of the budget itself keep to one."""
    monkeypatch.setattr(cv, "PRICING", dataclasses.replace(cv.PRICING, profile_budget_steps=1e9,
                                                           profile_budget_max_s=600.0))


def loaded(tmp_path: Path, name: str, backend: str, **over) -> LoadedModel:
    model, args = tiny_model("qwen2", backend=backend, vocab=512, **over)
    d = tmp_path / name
    d.mkdir()
    return LoadedModel(name=name, path=d, args=args, model=model, tokenizer=None, backend=backend, bundle_id="b1")


def counted(monkeypatch, m: LoadedModel, seconds_per_row: float = 0.0) -> tuple[list[int], list[float]]:
    """Count m's forwards (their rows) and, with seconds_per_row, put them on a fake profile clock that
    each forward advances by that much a row."""
    rows, clock = [], [0.0]
    if seconds_per_row:
        monkeypatch.setattr(cv, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    fast = m.model.forward

    def forward(tokens, *a, **kw):
        clock[0] += seconds_per_row * len(tokens)
        rows.append(len(tokens))
        return fast(tokens, *a, **kw)

    monkeypatch.setattr(m.model, "forward", forward)
    return rows, clock


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
    assert rows(9) == max(d["draft_cv"].values())        # never below a smaller S's (see the next test)
    profile_path(draft).write_text(json.dumps({k: v for k, v in d.items() if k != "draft_cv"}))
    own = max(c for s, c in d["cv"].items() if int(s) <= 9)
    assert runtime_costs(target, draft, draft_head=head)[1].rows(9) == own
    assert runtime_costs(target, draft_head=head)[1] is None


def test_a_dip_in_a_stored_curve_is_read_as_noise(tmp_path):
    """A profile timed in few repeats on a drifting machine can put a 2-row forward under a 1-row one; read
    so, a guess fed with the draft's next step would look free. The runtime prices a forward at no less
    than any narrower one's, the target's and the draft's curves alike."""
    target, draft = loaded(tmp_path, "t", "q4"), loaded(tmp_path, "d", "q4")
    t, d = load_or_measure(target, draft_head=head), load_or_measure(draft, draft_head=head)
    dip = {"1": 1.0, "2": 0.87, "3": 1.11, "5": 1.3, "9": 2.14}
    profile_path(target).write_text(json.dumps({**t, "cv": dip}))
    profile_path(draft).write_text(json.dumps({**d, "draft_cv": dip}))
    costs, drafting = runtime_costs(target, draft, draft_head=head)
    for curve in (costs.cv, drafting.rows):
        assert [curve(s) for s in (1, 2, 3, 5, 9)] == [1.0, 1.0, 1.11, 1.3, 2.14]


def test_measuring_announces_itself_once_and_why(tmp_path, capsys):
    m = loaded(tmp_path, "m", "fp32")
    load_or_measure(m, draft_head=head)
    err = capsys.readouterr().err
    assert "speczoo: timing m (fp32) once for its cost profile" in err and str(profile_path(m)) in err
    load_or_measure(m, draft_head=head)
    assert capsys.readouterr().err == ""                             # read back: nothing to say
    load_or_measure(m, remeasure=True, draft_head=head)
    assert "afresh" in capsys.readouterr().err


def test_a_later_load_reads_the_stored_profile_and_times_nothing(tmp_path, monkeypatch, capsys):
    m = loaded(tmp_path, "again", "q4")
    rows, _ = counted(monkeypatch, m)
    first = load_or_measure(m, draft_head=head)
    assert rows and first["key"] == profile_key(m) and "fitted" not in first
    rows.clear()
    capsys.readouterr()
    assert load_or_measure(m, draft_head=head) == first
    runtime_costs(m, m, draft_head=head)                 # as a runtime loads it: target and draft
    assert rows == [] and capsys.readouterr().err == ""
    assert [p.name for p in m.path.iterdir()] == [profile_path(m).name]      # written whole: no temporary left


@pytest.mark.parametrize("change", ["bundle", "threads", "cost_format", "kernel_path", "kernels"])
def test_a_profile_with_another_key_is_timed_again_and_replaced(tmp_path, monkeypatch, capsys, change):
    m = loaded(tmp_path, "keyed", "q4")
    stored = load_or_measure(m, draft_head=head)
    other = {**stored["key"], change: "something else"}
    profile_path(m).write_text(json.dumps({**stored, "key": other, "draft_ms": 123.0}))
    rows, _ = counted(monkeypatch, m)
    capsys.readouterr()
    data = load_or_measure(m, draft_head=head)
    assert rows and data["draft_ms"] != 123.0 and data["key"] == profile_key(m)
    assert f"timed for another setup ({change} something else -> " in capsys.readouterr().err
    assert json.loads(profile_path(m).read_text()) == data


def test_the_key_follows_the_bundle_and_the_threads(tmp_path, monkeypatch):
    m = loaded(tmp_path, "k", "q4")
    load_or_measure(m)
    repulled = dataclasses.replace(m, bundle_id="b2")
    rows, _ = counted(monkeypatch, repulled)
    assert load_or_measure(repulled)["key"]["bundle"] == "b2" and rows
    monkeypatch.setattr(cv.torch, "get_num_threads", lambda: 7)
    assert profile_path(m).name.endswith("-t7.json") and profile_key(m)["threads"] == 7


def test_an_unreadable_profile_is_timed_again(tmp_path, capsys):
    m = loaded(tmp_path, "broken", "fp32")
    load_or_measure(m)
    profile_path(m).write_text('{"ms": ')
    assert load_or_measure(m)["cv"]["1"] == 1.0
    assert "is unreadable" in capsys.readouterr().err


def test_the_budget_is_in_the_machines_own_steps(tmp_path, monkeypatch, capsys):
    """At 50 ms a row, then 0.5 s a row (a CPU ten times slower), the same budget of steps holds the whole
    profile, where a fixed few seconds would have cut both short; it is stored, and the next load reads it."""
    for i, per_row in enumerate((0.05, 0.5)):
        m = loaded(tmp_path, f"steps{i}", "q4")
        _, clock = counted(monkeypatch, m, per_row)
        data = load_or_measure(m, budget=StepBudget(steps=400, max_s=1e6), draft_head=head)
        assert "interpolated" not in data and "fitted" not in data and "draft_interpolated" not in data
        assert 6.0 < clock[0] <= 400 * per_row
        assert json.loads(profile_path(m).read_text()) == data
    assert "too slow" not in capsys.readouterr().err


def test_a_slow_path_keeps_to_the_budget_and_fits_the_larger_sizes(tmp_path, monkeypatch, capsys):
    """Every forward costing 50 ms a row on the profile's clock (a scalar path in miniature): the full
    profile would take about 15 s; within a 1 s cap it times S = 1 and 3 only, right after the probe
    and without the prefill, fits the rest on their line, and stores that, marked as fitted. The one-row
    prefetch choice first gets a quarter of the cap, too little for two rounds: one forward, no choice."""
    m = loaded(tmp_path, "slow", "q4")
    rows, clock = counted(monkeypatch, m, 0.05)
    data = load_or_measure(m, budget=StepBudget(steps=1e9, max_s=1.0), draft_head=head)
    assert clock[0] <= 1.0
    assert rows == [1, 1, 1, 3, 1, 3, 1, 3, 1, 3, 1]   # one-row choice, cold, probe 1 and 3, draft and target in turn
    assert "one_row" not in data and m.model.one_row_prefetch is False
    assert [int(s) for s in data["ms"]] == PROFILE_SIZES and data["interpolated"] == [2, 5, 9, 17]
    assert data["draft_interpolated"] == [2, 5, 9] and set(data["draft_cv"]) == {"1", "2", "3", "5", "9"}
    assert data["cv"] == {str(s): float(s) for s in PROFILE_SIZES}      # 17 rows cost 17 steps here
    assert data["fitted"] == ["target c_v(2, 5, 9, 17) fitted", "draft c_v(2, 5, 9) fitted"]
    assert json.loads(profile_path(m).read_text()) == data               # stored, marked as fitted
    err = capsys.readouterr().err
    assert "too slow to time everything within 1 s (the cap: 1e+09 steps of 50 ms would be " in err
    assert f"target c_v(2, 5, 9, 17) fitted; draft c_v(2, 5, 9) fitted, stored so, in {profile_path(m)}" in err
    rows.clear()
    assert load_or_measure(m, draft_head=head) == data and rows == []    # the next run reads it
    runtime_costs(m, m, draft_head=head)                # the controller reads a fitted profile as any other
    assert load_or_measure(m, remeasure=True, budget=StepBudget(steps=1e9, max_s=1.0), draft_head=head)
    assert "for this run only (not stored)" in capsys.readouterr().err


def test_no_time_for_the_draft_head_leaves_its_step_out(tmp_path, monkeypatch, capsys):
    """A row that takes 40% of the budget: the target's S = 1 and 3 are timed all the same (one point
    cannot price the others), the draft gets no time and its step is left out, so the controller prices
    it as the full head's."""
    m = loaded(tmp_path, "slower", "q4")
    counted(monkeypatch, m, 0.4)
    data = load_or_measure(m, budget=StepBudget(steps=1e9, max_s=1.0), draft_head=head)
    assert data["cv"] == {str(s): float(s) for s in PROFILE_SIZES} and "draft_ms" not in data
    assert "no time for the draft head" in capsys.readouterr().err and "no time for the draft head" in data["fitted"][-1]
    assert runtime_costs(m, m, draft_head=head)[1].step == 1.0


def test_a_bundle_it_cannot_write_to_still_gets_its_profile(tmp_path, monkeypatch, capsys):
    m = loaded(tmp_path, "readonly", "fp32")

    def refuse(*a, **kw):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert load_or_measure(m)["cv"]["1"] == 1.0 and not profile_path(m).exists()
    assert "could not store readonly's cost profile (read-only file system)" in capsys.readouterr().err


def test_another_draft_head_size_is_timed_once_for_the_draft_alone_and_stored(tmp_path, monkeypatch):
    """A non-default --draft-vocab keys its own stored draft profile: the first load times the draft (never
    the target, whose profile holds the default size), a later one times nothing; the default's file stays."""
    target, draft = loaded(tmp_path, "t", "q4"), loaded(tmp_path, "d", "q4")
    runtime_costs(target, draft, draft_head=head)
    t_rows, _ = counted(monkeypatch, target)
    d_rows, _ = counted(monkeypatch, draft)
    _, small = runtime_costs(target, draft, draft_head=head, draft_vocab=64)
    assert t_rows == [] and d_rows                                    # the draft alone was timed
    assert profile_path(draft, 64).name.endswith("-dv64.json") and profile_path(draft, 64).is_file()
    assert json.loads(profile_path(draft, 64).read_text())["key"] == profile_key(draft, 64)
    d_rows.clear()
    again = runtime_costs(target, draft, draft_head=head, draft_vocab=64)[1]
    assert (again.step, again.rows(9)) == (small.step, small.rows(9)) and d_rows == []
    assert profile_path(draft).is_file() and profile_path(draft) != profile_path(draft, 64)
    assert profile_path(draft, None).name.endswith("-dvfull.json")


def test_the_one_row_prefetch_is_chosen_with_the_profile_and_applied_at_every_load(tmp_path):
    """A compiled model's profile times its one-row forward both ways and stores the choice; a later load
    sets the model to it, and the model sets the kernels to it before each forward. A float model (no
    compiled kernels) has nothing to choose."""
    from speczoo.kernels import native

    m = loaded(tmp_path, "pf", "q4")
    data = load_or_measure(m)
    assert set(data["one_row"]) == {"prefetch", "ms", "rounds"} and data["one_row"]["rounds"] >= 2
    assert m.model.one_row_prefetch is data["one_row"]["prefetch"]
    for choice in (True, False):
        profile_path(m).write_text(json.dumps({**data, "one_row": {**data["one_row"], "prefetch": choice}}))
        again = dataclasses.replace(m, model=loaded(tmp_path, f"pf{choice}", "q4").model)    # a fresh load
        load_or_measure(again)
        assert again.model.one_row_prefetch is choice
        native.set_one_row_prefetch(not choice)
        again.model(torch.tensor([1]), torch.tensor([0]), KVCache(again.args, 4))
        assert native.one_row_prefetch() is choice
    native.set_one_row_prefetch(False)
    assert "one_row" not in load_or_measure(loaded(tmp_path, "f", "fp32"))
