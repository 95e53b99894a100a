"""How many threads the next forward should run on, from how long the last ones took: the thread count
follows the cores actually free (issue #32, "never collapse under load").

With a core taken by another program, an OpenMP team of one thread per core waits at every barrier for
the thread that shares its core with that program: a decode step of the 1.5B on a 2-core Zen 2 ran at
0.30x its quiet speed with 2 threads and at 0.62x with 1. The kernels' output does not depend on the
thread count (tests/decoding/test_engine_threads.py), so the count may change between any two forwards.

The pilot sees each decode forward's size S (rows), the count it ran on, and its seconds. A forward's
*slowness* is its time over the fastest forward of that S seen at any count: a figure comparable across
S and across counts. Then, with the constants of `Piloting`:
  * at n threads, `slow_steps` forwards in a row that each took over `slow_factor` times the best of their
    S at n start a *trial* of n - 1; the count never run below n is tried once after `first_trial`
    forwards, so a process that started under load learns what n - 1 gives;
  * below the top count, a *probe* of n + 1, so that a core freed is taken back: after `free_wait`
    forwards when at least `free_cores` of the process's cores sat idle on average over the last
    `try_steps` forwards (where the caller can tell: speczoo/threads.py reads /proc/stat), else every
    `probe_every` forwards (a program of lower priority may keep a core busy that one more thread would
    still get); a probe whose first forward is `abort_factor` times slower than the count in use ends there;
  * a try (trial or probe) runs `try_steps` forwards at the other count, then as many back at the count
    in use, and wins when the median slowness of its own forwards is below that of the ones after it (so
    a burst of load that started a trial and is over does not make the other count look better); the
    winner becomes the count in use. A try that loses doubles the wait before the next try in its
    direction (up to `wait_max`; a probe on idle cores, its own `free_wait`); one that wins resets them.
Forwards of a try are not *settled*: the cost meter, which prices speculation from the forwards at the
count in use, does not time them (decoding/round.py).

Pure bookkeeping: seconds and counts in, a count out. It never reads a clock, never touches torch or
the OpenMP runtime (speczoo/threads.py applies what it says), and never changes what a forward computes.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Piloting:
    """The pilot's constants (docs/tuning.md, "One row per field of `Piloting`", says how each was chosen).

    slow_factor:  a forward over this many times the best of its S at its count is slow.
    slow_steps:   this many slow forwards in a row start a trial of one thread fewer.
    first_trial:  forwards after which a count never run below the one in use is tried once.
    try_steps:    forwards a trial or a probe runs, and then at the count in use, to compare the two.
    abort_factor: a probe whose first forward is this many times slower than the last ones at the count in
                  use stops there.
    probe_every:  forwards at the count in use between tries, at first and after a try that won.
    free_cores:   idle cores (an average over the last try_steps forwards) that start a probe early.
    free_wait:    forwards at the count in use before a probe started by idle cores.
    wait_max:     the longest wait between tries in one direction, after tries that lost.
    """

    slow_factor: float = 1.4
    slow_steps: int = 3
    first_trial: int = 16
    try_steps: int = 3
    abort_factor: float = 1.3
    probe_every: int = 64
    free_cores: float = 0.5
    free_wait: int = 4
    wait_max: int = 512

    def __post_init__(self) -> None:
        bad = [f"{n} must be > 1" for n in ("slow_factor", "abort_factor")
               if not (getattr(self, n) > 1.0 and math.isfinite(getattr(self, n)))]
        bad += [f"{n} must be >= 1" for n in ("slow_steps", "first_trial", "try_steps", "probe_every", "free_wait")
                if getattr(self, n) < 1]
        if not 0.0 < self.free_cores < math.inf:
            bad.append("free_cores must be > 0")
        if self.wait_max < max(self.probe_every, self.free_wait):
            bad.append("wait_max must be >= probe_every and free_wait")
        if bad:
            raise ValueError(f"bad thread piloting: {'; '.join(bad)} (got {self})")


PILOTING = Piloting()


@dataclass(frozen=True, slots=True)
class Decision:
    """What the pilot says after a forward: the count for the next one, and whether the forward just seen
    ran at the count in use (settled), not in a try of another."""

    threads: int
    settled: bool


class ThreadPilot:
    """Chooses the thread count, between 1 and `top`, from the times of the forwards (see the module).

    count:    the count in use; wanted: the count the next forward should run on (a try's, during one).
    switches: how many times the count in use has changed.
    """

    def __init__(self, top: int, piloting: Piloting = PILOTING):
        if top < 1:
            raise ValueError(f"the thread count to pilot must be at least 1, got {top}")
        self.top = top
        self.piloting = piloting
        self.count = top
        self.switches = 0
        self._best: dict[tuple[int, int], float] = {}     # (count, S) -> the fastest seconds seen
        self._ref: dict[int, float] = {}                  # S -> the fastest seconds seen at any count
        self._recent: deque[float] = deque(maxlen=piloting.try_steps)   # slowness at the count in use
        self._slow_run = 0
        self._since = 0                                   # forwards at the count in use since the last try
        self._wait = {-1: 0, +1: piloting.probe_every}    # forwards before the next try down / up
        self._free_wait = piloting.free_wait              # forwards before a probe on idle cores
        self._free: deque[float] = deque(maxlen=piloting.try_steps)     # idle cores during the last forwards
        self._on_free = False                             # whether the try under way was started by idle cores
        self._run: set[int] = {top}                       # counts that have run a forward
        self._trying: int | None = None                   # the count on trial (a try is under way)
        self._back = False                                # the try's forwards are done: the count in use again
        self._tried: list[float] = []                     # slowness of the try's forwards
        self._after: list[float] = []                     # and of the forwards back at the count in use

    @property
    def wanted(self) -> int:
        return self._trying if self._trying is not None and not self._back else self.count

    def observe(self, n: int, s: int, seconds: float, free: float | None = None) -> Decision:
        """A decode forward of `s` rows ran on `n` threads in `seconds`, while `free` of the process's cores
        sat idle on average since the forward before (None: not known); returns the next count. A forward
        on a count the pilot did not ask for (someone else set it) is recorded, and the pilot's count
        comes back."""
        if s < 1 or not (seconds > 0 and math.isfinite(seconds)):
            return Decision(self.wanted, False)
        n = max(1, min(n, self.top))
        self._run.add(n)
        key = (n, s)
        self._best[key] = min(self._best.get(key, math.inf), seconds)
        self._ref[s] = min(self._ref.get(s, math.inf), seconds)
        slowness = seconds / self._ref[s]
        if n != self.wanted:
            return Decision(self.wanted, False)
        if n != self.count:
            return self._try_step(slowness)
        self._recent.append(slowness)
        if free is not None:
            self._free.append(free)
        if self._back:
            return self._back_step(slowness)
        return self._settled_step(seconds > self.piloting.slow_factor * self._best[key])

    def _settled_step(self, slow: bool) -> Decision:
        p = self.piloting
        self._slow_run = self._slow_run + 1 if slow else 0
        self._since += 1
        down = self.count > 1 and self._since >= self._wait[-1] and (
            self._slow_run >= p.slow_steps or (self.count - 1 not in self._run and self._since >= p.first_trial))
        freed = (len(self._free) == self._free.maxlen and statistics.fmean(self._free) >= p.free_cores
                 and self._since >= self._free_wait)
        up = self.count < self.top and (self._since >= self._wait[+1] or freed)
        if down or up:
            self._trying = self.count - 1 if down else self.count + 1
            self._on_free = not down and self._since < self._wait[+1]
            self._tried, self._after = [], []
        return Decision(self.wanted, True)

    def _try_step(self, slowness: float) -> Decision:
        """A forward at the count on trial: after try_steps of them, back to the count in use for as many."""
        p = self.piloting
        self._tried.append(slowness)
        before = statistics.median(self._recent) if self._recent else math.inf
        if self._trying > self.count and len(self._tried) == 1 and slowness > p.abort_factor * before:
            return self._end_try(won=False)
        if len(self._tried) >= p.try_steps:
            self._back = True
        return Decision(self.wanted, False)

    def _back_step(self, slowness: float) -> Decision:
        """A forward at the count in use right after a try: the try is judged against these, so that a
        burst of load before it (which started a trial) does not make the other count look better."""
        self._after.append(slowness)
        if len(self._after) < self.piloting.try_steps:
            return Decision(self.wanted, True)
        won = statistics.median(self._tried) < statistics.median(self._after)
        self._end_try(won)
        return Decision(self.wanted, True)

    def _end_try(self, won: bool) -> Decision:
        p = self.piloting
        direction = +1 if self._trying > self.count else -1
        if won:
            self.count = self._trying
            self.switches += 1
            self._recent.clear()
            self._recent.extend(self._tried)
            self._wait = {-1: 0, +1: p.probe_every}
            self._free_wait = p.free_wait
        elif self._on_free:
            self._free_wait = min(p.wait_max, 2 * self._free_wait)
        else:
            self._wait[direction] = min(p.wait_max, max(p.probe_every, 2 * self._wait[direction]))
        self._free.clear()
        self._trying, self._back = None, False
        self._slow_run = self._since = 0
        return Decision(self.wanted, False)
