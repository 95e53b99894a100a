"""How many threads the kernels and torch use: the count set early by the CLI, and the steering that
lowers it while another program holds a core and raises it again when the core is free.

The compiled kernels read torch.get_num_threads() at every call, so torch.set_num_threads is the one
switch for both. The count is, first to last: `--threads N`, then $OMP_NUM_THREADS, then the machine's
physical cores (a second hyper-thread on a core only fights the first for the same SIMD units and
memory bandwidth). The physical cores come from the kernels' CPU reader (kernels/native.py: the unique
(physical id, core id) pairs of /proc/cpuinfo, `sysctl hw.physicalcpu` on macOS, else os.cpu_count()).

That count is the top. Unless it is fixed, a runtime's engine steers the count between 1 and the top
while it generates (`Steer`, deciding through speczoo/thread_pilot.py from the times of its decode
forwards), and puts the top back when each generation ends, so that everything outside a generation
(cost profiles, keyed by the thread count; packing; `speczoo doctor`) sees the top. The count is fixed
by `--threads N` ("fixed means fixed"), by $OMP_NUM_THREADS (the user's count, as OpenMP defines it),
and by SPECZOO_ADAPTIVE_THREADS=0. The kernels' output does not depend on the count, so steering never
changes a token or a logit (tests/decoding/test_engine_threads.py).

This module never guesses around a bad value: a --threads, $OMP_NUM_THREADS or SPECZOO_ADAPTIVE_THREADS
that is not what it must be is an error that says so, not a silent default.
"""

from __future__ import annotations

import os
from pathlib import Path

from speczoo.thread_pilot import ThreadPilot

OMP_ENV = "OMP_NUM_THREADS"
ADAPT_ENV = "SPECZOO_ADAPTIVE_THREADS"


def physical_cores() -> int:
    """The machine's physical cores (at least 1)."""
    from speczoo.kernels.native import cpu_info

    return max(1, cpu_info().physical_cores)


def env_threads() -> int | None:
    """$OMP_NUM_THREADS as a thread count, None when unset or empty. OpenMP allows a list ("4,2" for
    nested levels); the first level is the one that counts here."""
    raw = os.environ.get(OMP_ENV, "").strip()
    if not raw:
        return None
    first = raw.split(",", 1)[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise ValueError(f"{OMP_ENV}={raw!r} is not a positive number of threads; set it to one (e.g. 4) or unset it")
    return int(first)


def default_threads() -> int:
    """The thread count when --threads is not given: $OMP_NUM_THREADS, else the physical cores."""
    return env_threads() or physical_cores()


def resolve_threads(n: int | None) -> int:
    """The count to use: `n` (--threads) when given, else default_threads()."""
    if n is None:
        return default_threads()
    if n < 1:
        raise ValueError(f"--threads must be at least 1, got {n}")
    return n


def threads_source(n: int | None) -> str:
    """Where resolve_threads(n) takes its count from, in words (for `speczoo doctor`)."""
    if n is not None:
        return "--threads"
    if env_threads() is not None:
        return f"${OMP_ENV}"
    return "the physical cores"


def env_adaptive() -> bool:
    """SPECZOO_ADAPTIVE_THREADS: "0" fixes the count, "1" or unset lets it adapt."""
    raw = os.environ.get(ADAPT_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{ADAPT_ENV}={raw!r} must be 0 (a fixed thread count) or 1 (adapt to the cores free)")
    return raw != "0"


def fixed_by(n: int | None) -> str | None:
    """What fixes the thread count given --threads `n`, in words; None: the count adapts."""
    adaptive = env_adaptive()         # read first: a bad value is an error whatever else is set
    if n is not None:
        return "--threads"
    if env_threads() is not None:
        return f"${OMP_ENV}"
    if not adaptive:
        return f"{ADAPT_ENV}=0"
    return None


_applied = False                    # whether apply_threads ran (the CLI); if not, a library use
_fixed_by: str | None = None        # what apply_threads found fixing the count (None: it adapts)
_steer: Steer | None = None


def apply_threads(n: int | None = None) -> int:
    """Set torch's (and so the kernels') thread count to resolve_threads(n), the top that a runtime's
    steering may lower it from while it generates, unless fixed_by(n) fixes it; returns it."""
    import torch

    global _applied, _fixed_by
    count = resolve_threads(n)
    _applied, _fixed_by = True, fixed_by(n)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


def fixed() -> str | None:
    """What fixes this process's thread count, in words (None: it adapts): as apply_threads found it, else
    (a library use that never called it) as the environment says."""
    return _fixed_by if _applied else fixed_by(None)


class IdleCores:
    """How many of the cores this process may run on sat idle, on average, between two reads (Linux's
    /proc/stat: idle and iowait time of each of those CPUs over all of their time). Where there is no
    /proc/stat or no CPU affinity to read, read() says None (not known)."""

    def __init__(self, stat: Path = Path("/proc/stat")):
        self.stat = stat
        try:
            self.cpus = {f"cpu{c}".encode() for c in os.sched_getaffinity(0)}
        except (AttributeError, OSError):          # not Linux
            self.cpus = set()
        self._last: tuple[int, int] | None = None

    def reset(self) -> None:
        """Forget the last read: the next one only starts the interval."""
        self._last = None

    def read(self) -> float | None:
        """The idle cores since the last read (None after a reset, or where nothing can be read)."""
        now = self._jiffies()
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return (now[0] - last[0]) / (now[1] - last[1]) * len(self.cpus)

    def _jiffies(self) -> tuple[int, int] | None:
        if not self.cpus:
            return None
        try:
            text = self.stat.read_bytes()
        except OSError:
            return None
        idle = total = 0
        for line in text.splitlines():
            if not line.startswith(b"cpu"):
                break
            name, *fields = line.split()
            if name in self.cpus:
                ticks = [int(f) for f in fields[:8]]   # user nice system idle iowait irq softirq steal
                idle += ticks[3] + ticks[4]
                total += sum(ticks)
        return idle, total


class Steer:
    """Applies a ThreadPilot's count to torch (and so the kernels) for the time of a generation.

    begin() before the generation's first forward, timed(s, seconds) after each of its decode forwards
    (returns whether that forward ran at the count in use, for the cost meter), end() when it ends. The
    top is torch's count when a generation begins (apply_threads', or whatever a library user set since),
    and it comes back at the end; the pilot keeps what it learnt for the next generation with that top.
    A top of one thread leaves nothing to steer. Below the top the pilot is also told the idle cores
    (`IdleCores`, one read of /proc/stat per forward): at the top, its own threads keep every core busy.
    """

    def __init__(self, idle: IdleCores | None = None):
        self.pilot: ThreadPilot | None = None
        self.idle = IdleCores() if idle is None else idle

    def begin(self) -> None:
        import torch

        top = torch.get_num_threads()
        if self.pilot is None or self.pilot.top != top:
            self.pilot = ThreadPilot(top) if top > 1 else None
        self.idle.reset()
        if self.pilot is not None:
            _set_torch_threads(self.pilot.wanted)
            self._read_idle()

    def timed(self, s: int, seconds: float) -> bool:
        import torch

        if self.pilot is None:
            return True
        decision = self.pilot.observe(torch.get_num_threads(), s, seconds, self._read_idle())
        _set_torch_threads(decision.threads)
        return decision.settled

    def _read_idle(self) -> float | None:
        if self.pilot.count < self.pilot.top:
            return self.idle.read()
        self.idle.reset()
        return None

    def end(self) -> None:
        if self.pilot is not None:
            _set_torch_threads(self.pilot.top)


def _set_torch_threads(n: int) -> None:
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def steer() -> Steer | None:
    """The process's steering, for a runtime's engine (one for the process, as the count is the process's);
    None when the count is fixed."""
    global _steer
    if fixed() is not None:
        return None
    if _steer is None:
        _steer = Steer()
    return _steer
