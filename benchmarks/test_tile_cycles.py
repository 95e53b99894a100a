"""The tile harness (python -m benchmarks.tile_cycles): it builds with the path's flags, times every format at
every tile height the path has, and says whether each tile equals its rows run alone. Speeds themselves are
measured by the bench, never asserted here."""

import pytest

from benchmarks import tile_cycles as tc
from speczoo.kernels import native


def test_every_format_and_tile_height_of_the_path_is_timed_and_invariant(capsys):
    tc.main(["--windows", "2", "--calls", "2"])
    out = capsys.readouterr().out
    path = native.chosen_path()
    assert f"== {path.name} tiles" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert set(rows) == set(tc.FORMATS)
    heights = int(out.splitlines()[1].split()[-2].removeprefix("R="))
    assert heights >= 1
    for cells in rows.values():
        assert len(cells) == heights + 1 and cells[-1] == "yes"
        assert all(float(c) > 0 for c in cells[:-1])


def test_the_scalar_reference_builds_too():
    times = tc.measure(native.scalar_path(), windows=1, calls=1)
    assert {t.fmt for t in times} == set(tc.FORMATS) and all(t.invariant and t.ns > 0 for t in times)


def test_a_tile_that_is_not_invariant_fails_the_run(monkeypatch, capsys):
    bad = tc.parse("q4 1 5.0 1\nq4 2 3.0 0\nq6 1 9.0 1\nq6 2 7.0 1\nq50 1 8.0 1\nq50 2 6.0 1\n")
    monkeypatch.setattr(tc, "measure", lambda path, windows, calls: bad)
    with pytest.raises(SystemExit, match="not batch-invariant"):
        tc.main([])
    assert "q4      5.00     3.00   NO" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--windows", "0"], ["--calls", "-1"], ["--path", "no-such-path"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises((SystemExit, native.KernelBuildError)):
        tc.main(argv)
