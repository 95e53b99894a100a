"""The thread count (speczoo/threads.py): physical cores by default, $OMP_NUM_THREADS over that,
--threads over both; bad values are errors; the CLI applies it before a command runs."""

import pytest
import torch

from speczoo import threads
from speczoo.kernels import native
from speczoo.thread_pilot import PILOTING

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


@pytest.fixture
def fresh(monkeypatch):
    """threads.py as in a process that never applied a count, SPECZOO_ADAPTIVE_THREADS and OMP_NUM_THREADS unset."""
    monkeypatch.setattr(threads, "_applied", False)
    monkeypatch.setattr(threads, "_fixed_by", None)
    monkeypatch.setattr(threads, "_steer", None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(threads.ADAPT_ENV, raising=False)


def test_the_count_adapts_unless_something_fixes_it(fresh, monkeypatch, cpuinfo):
    cpuinfo(TWO_SOCKETS)
    assert threads.fixed_by(None) is None and threads.fixed() is None
    assert threads.fixed_by(2) == "--threads"
    monkeypatch.setenv(threads.ADAPT_ENV, "0")
    assert threads.fixed_by(None) == "SPECZOO_ADAPTIVE_THREADS=0" and threads.steer() is None
    monkeypatch.setenv(threads.ADAPT_ENV, "1")
    assert threads.fixed_by(None) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.fixed_by(None) == "$OMP_NUM_THREADS"
    monkeypatch.delenv("OMP_NUM_THREADS")
    threads.apply_threads(2)                        # --threads 2: fixed, whatever the environment says
    assert threads.fixed() == "--threads" and threads.steer() is None
    threads.apply_threads(None)
    assert threads.fixed() is None and threads.steer() is threads.steer() is not None


@pytest.mark.parametrize("bad", ["2", "yes", "off"])
def test_a_bad_adaptive_setting_is_an_error(fresh, monkeypatch, bad):
    monkeypatch.setenv(threads.ADAPT_ENV, bad)
    with pytest.raises(ValueError, match="SPECZOO_ADAPTIVE_THREADS"):
        threads.fixed_by(3)


def test_the_steer_moves_torchs_count_within_a_generation_and_puts_the_top_back(fresh):
    steer = threads.steer()
    torch.set_num_threads(2)
    steer.begin()
    assert steer.pilot.top == 2 and torch.get_num_threads() == 2
    seen = []
    for i in range(80):              # two threads slow from the 5th forward on, one thread fast
        n = torch.get_num_threads()
        seen.append(n)
        steer.timed(1, 0.02 if i < 5 else (0.08 if n == 2 else 0.035))
    assert seen[-1] == 1 and torch.get_num_threads() == 1 and steer.pilot.count == 1
    steer.end()
    assert torch.get_num_threads() == 2
    steer.begin()                    # the next generation starts where the pilot stands
    assert torch.get_num_threads() == 1
    steer.end()


def test_the_steer_follows_a_count_set_outside_it_and_leaves_one_thread_alone(fresh):
    steer = threads.steer()
    torch.set_num_threads(3)
    steer.begin()
    assert steer.pilot.top == 3
    steer.end()
    torch.set_num_threads(1)
    steer.begin()
    assert steer.pilot is None and steer.timed(1, 0.5) and torch.get_num_threads() == 1
    steer.end()
    assert torch.get_num_threads() == 1


def stat_text(cpu0: tuple[int, int], cpu1: tuple[int, int]) -> str:
    """/proc/stat with each CPU's (idle, busy) ticks."""
    (i0, b0), (i1, b1) = cpu0, cpu1
    return (f"cpu  {b0 + b1} 0 0 {i0 + i1} 0 0 0 0 0 0\n"
            f"cpu0 {b0} 0 0 {i0} 0 0 0 0 0 0\ncpu1 {b1} 0 0 {i1} 0 0 0 0 0 0\nintr 1 2 3\n")


def test_idle_cores_are_read_from_proc_stat_over_the_cpus_this_process_may_use(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    idle = threads.IdleCores(stat)
    stat.write_text(stat_text((100, 100), (100, 100)))
    assert idle.read() is None                      # the first read starts the interval
    stat.write_text(stat_text((100, 150), (150, 100)))       # 50 ticks: cpu0 busy, cpu1 idle
    assert idle.read() == pytest.approx(1.0)
    stat.write_text(stat_text((110, 190), (160, 140)))       # then 10 of 50 ticks idle on each
    assert idle.read() == pytest.approx(0.4)
    idle.reset()
    assert idle.read() is None
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {1})
    one = threads.IdleCores(stat)
    one.read()
    stat.write_text(stat_text((110, 300), (200, 140)))       # cpu1: 40 of 40 ticks idle; cpu0 is not ours
    assert one.read() == pytest.approx(1.0)
    assert threads.IdleCores(tmp_path / "missing").read() is None


def test_the_steer_tells_the_pilot_the_idle_cores_below_the_top_only(fresh):
    class Idle:
        def __init__(self):
            self.reads = 0

        def reset(self):
            pass

        def read(self):
            self.reads += 1
            return 1.0

    idle = Idle()
    steer = threads.Steer(idle)
    torch.set_num_threads(2)
    steer.begin()
    for _ in range(10):
        steer.timed(1, 0.02)
    assert idle.reads == 0                           # at the top: nothing read
    steer.pilot.count = 1                            # as after a trial that won
    torch.set_num_threads(1)
    seen = []
    for _ in range(PILOTING.free_wait + 1):
        seen.append(torch.get_num_threads())
        steer.timed(1, 0.035)
    assert idle.reads > 0 and 2 in seen, "idle cores start a probe of two threads"
    steer.end()
