"""The thread count (speczoo/threads.py): physical cores by default, $OMP_NUM_THREADS over that,
--threads over both; bad values are errors; the CLI applies it before a command runs."""

import pytest
import torch

from speczoo import threads
from speczoo.kernels import native

# Two physical cores with two hyper-threads each: four "processor" entries, two (physical id, core id).
HYPERTHREADED = "".join(
    f"processor\t: {i}\nmodel name\t: Test CPU\nphysical id\t: 0\ncore id\t\t: {core}\n"
    f"flags\t\t: fpu avx avx2 fma\n\n" for i, core in enumerate((0, 1, 0, 1)))
# Two sockets, each with a core 0: the pairs, not the core ids alone, count.
TWO_SOCKETS = "".join(f"processor\t: {i}\nphysical id\t: {i}\ncore id\t\t: 0\n\n" for i in range(2))


@pytest.fixture
def cpuinfo(monkeypatch):
    """Make the CPU reader see the given /proc/cpuinfo text."""
    def use(text: str):
        monkeypatch.setattr(native, "cpu_info", lambda: native.parse_cpuinfo(text, "x86_64"))
    return use


@pytest.fixture(autouse=True)
def restore_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_default_is_the_physical_cores(cpuinfo, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpuinfo(HYPERTHREADED)
    assert native.cpu_info().logical_cores == 4
    assert threads.physical_cores() == 2 and threads.default_threads() == 2
    cpuinfo(TWO_SOCKETS)
    assert threads.default_threads() == 2


def test_omp_num_threads_wins_over_the_cores_and_threads_flag_over_both(cpuinfo, monkeypatch):
    cpuinfo(HYPERTHREADED)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.default_threads() == 3
    assert threads.resolve_threads(None) == 3
    assert threads.resolve_threads(1) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")       # nested levels: the first counts
    assert threads.default_threads() == 4
    monkeypatch.setenv("OMP_NUM_THREADS", " ")
    assert threads.default_threads() == 2


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_a_bad_omp_num_threads_is_an_error(monkeypatch, bad):
    monkeypatch.setenv("OMP_NUM_THREADS", bad)
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        threads.default_threads()


def test_bad_threads_flag_is_an_error():
    with pytest.raises(ValueError, match="--threads"):
        threads.resolve_threads(0)


def test_apply_sets_torch_threads(cpuinfo, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpuinfo(TWO_SOCKETS)
    assert threads.apply_threads(1) == 1 and torch.get_num_threads() == 1
    assert threads.apply_threads(None) == 2 and torch.get_num_threads() == 2


def test_every_command_takes_threads_and_the_cli_applies_it(monkeypatch):
    from speczoo import cli

    parser = cli.build_parser()
    for name, p in parser._subparsers._group_actions[0].choices.items():
        assert "--threads" in p._option_string_actions, name
    seen = []
    monkeypatch.setattr(cli, "apply_threads", seen.append)
    assert cli.main(["cost", "--threads", "1"]) == 0
    assert seen == [1]
    assert cli.main(["cost"]) == 0
    assert seen == [1, None]


def test_cli_reports_a_bad_thread_count(monkeypatch, capsys):
    from speczoo import cli

    monkeypatch.setenv("OMP_NUM_THREADS", "zero")
    assert cli.main(["cost"]) == 2
    assert "OMP_NUM_THREADS" in capsys.readouterr().err
