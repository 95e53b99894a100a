"""How many threads the next forward should run on, from how long the last ones took: the thread count
follows the cores actually free (issue #32, "never collapse under load").

With a core taken by another program, an OpenMP team of one thread per core waits at every barrier for
the thread that shares its core with that program: a decode step of the 1.5B on a 2-core Zen 2 ran at
0.30x its quiet speed with 2 threads and at 0.62x with 1. The kernels' output does not depend on the
thread count (tests/decoding/test_engine_threads.py), so the count may change between any two forwards.

Such a team is not slow at every forward: on a 2-core Zen 4 most forwards took ~1.7x their quiet time
and one in 8-10 stalled for 5-10x (the scheduler's slice for the other program), so a median, which
drops the stalls, saw two threads within 10% of one while their mean was 1.5x one's. The pilot therefore
judges counts by the *mean* time of many forwards, the stalls included: the time a user waits.

The pilot sees each decode forward's size S (rows), the count it ran on, and its seconds. A forward's
*slowness* is its time over the fastest forward of that S seen at any count: a figure comparable across
S and across counts. Then, with the constants of `Piloting`:
  * at n threads, when the median of the last `window` forwards took over `slow_factor` times the best of
    its S at n (the median: a lone stall on a quiet machine starts nothing; under a busy core, most
    forwards are slow too), a *trial* of n - 1 starts; the count never run below n is tried once after
    `first_trial` forwards, so a process that started under load learns what n - 1 gives. A trial waits
    for the wait that lost trials doubled, unless that median, over a window all after the last trial
    that lost, has grown past `abort_factor` times the one that started it: a quiet host's drift loses
    trials and doubles the wait (docs/tuning.md), and a program that then takes a core must not wait
    those hundreds of forwards;
  * below the top count, a *probe* of n + 1, so that a core freed is taken back: after `free_wait`
    forwards when at least `free_cores` of the process's cores sat idle on average over the last
    `free_wait` forwards (where the caller can tell: speczoo/threads.py reads /proc/stat), else every
    `probe_every` forwards (a program of lower priority may keep a core busy that one more thread would
    still get);
  * a try (trial or probe) runs `try_steps` forwards at the other count, then as many back at the count
    in use; the first forward after each change of count is not judged (it pays for the change). The try
    wins when the mean slowness of its own forwards is below that of the count in use's, taken over the
    `window` forwards before the try and those after it together (so a burst of load that started a trial
    and is over does not make the other count look better, and one stall more or less on either side
    does not decide). A try whose mean passes `abort_factor` times the count in use's before it (the
    whole window's or its last LOOKBACK forwards', whichever is slower: a load may have just begun) ends
    at once and loses: one slow forward is what a try of a worse count costs, most of the time. One whose
    mean, after LOOKBACK judged forwards, is below the count in use's before it over `abort_factor` (the
    window's later half's, those that made its median slow, or its last LOOKBACK's, whichever is faster)
    wins at once, without the forwards back: the count in use is then plainly the slower one, and each
    forward back at it would cost that much (were it a burst of load that just ended, the probe on idle
    cores takes the count back). A try that loses doubles the wait before the next try in its direction
    (up to `wait_max`; a probe on idle cores, its own `free_wait`); one that wins resets them.
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

SKIP = 1        # forwards after a change of count that are not judged: the team's change is in their time
LOOKBACK = 4    # the last forwards before a try that a try is also held against (a load that just began)


@dataclass(frozen=True)
class Piloting:
    """The pilot's constants (docs/tuning.md, "One row per field of `Piloting`", says how each was chosen).

    slow_factor:  the last `window` forwards over this many times the best of their S at their count (their
                  median) start a trial of one thread fewer.
    window:       forwards at the count in use whose median starts a trial and whose mean a try is held against.
    first_trial:  forwards after which a count never run below the one in use is tried once.
    try_steps:    judged forwards a trial or a probe runs, and then at the count in use, to compare the two.
    abort_factor: a try whose mean slowness passes this many times the count in use's stops there.
    probe_every:  forwards at the count in use between tries, at first and after a try that won.
    free_cores:   idle cores (an average over the last free_wait forwards) that start a probe early.
    free_wait:    forwards at the count in use before a probe started by idle cores.
    wait_max:     the longest wait between tries in one direction, after tries that lost.
    """

    slow_factor: float = 1.4
    window: int = 16
    first_trial: int = 16
    try_steps: int = 12
    abort_factor: float = 1.25
    probe_every: int = 64
    free_cores: float = 0.5
    free_wait: int = 4
    wait_max: int = 512

    def __post_init__(self) -> None:
        bad = [f"{n} must be > 1" for n in ("slow_factor", "abort_factor")
               if not (getattr(self, n) > 1.0 and math.isfinite(getattr(self, n)))]
        bad += [f"{n} must be >= 1" for n in ("window", "first_trial", "try_steps", "probe_every", "free_wait")
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
        self._recent: deque[float] = deque(maxlen=piloting.window)   # slowness at the count in use
        self._own: deque[float] = deque(maxlen=piloting.window)      # time over the best of its S at the count
        self._skip = 0                                    # forwards at the count in use still not judged
        self._since = 0                                   # forwards at the count in use since the last try
        self._wait = {-1: 0, +1: piloting.probe_every}    # forwards before the next try down / up
        self._free_wait = piloting.free_wait              # forwards before a probe on idle cores
        self._free: deque[float] = deque(maxlen=piloting.free_wait)  # idle cores during the last forwards
        self._on_free = False                             # whether the try under way was started by idle cores
        self._level = 1.0                                 # the median slowness that started the try under way
        self._lost_level = 0.0                            # and the one that started the last trial down that lost
        self._run: set[int] = {top}                       # counts that have run a forward
        self._trying: int | None = None                   # the count on trial (a try is under way)
        self._back = False                                # the try's forwards are done: the count in use again
        self._seen = 0                                    # forwards of the try's current phase, judged or not
        self._tried: list[float] = []                     # slowness of the try's judged forwards
        self._after: list[float] = []                     # and of the judged forwards back at the count in use

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
        if free is not None:
            self._free.append(free)
        if self._back:
            return self._back_step(slowness)
        if self._skip:
            self._skip -= 1
        else:
            self._recent.append(slowness)
            self._own.append(seconds / self._best[key])
        return self._settled_step()

    def _settled_step(self) -> Decision:
        p = self.piloting
        self._since += 1
        level = statistics.median(self._own) if len(self._own) == self._own.maxlen else 1.0
        slow = level > p.slow_factor
        # slower than when the last trial down lost, over a window of forwards all after it
        worse = slow and self._since >= p.window and level > p.abort_factor * self._lost_level
        down = self.count > 1 and (self._since >= self._wait[-1] or worse) and (
            slow or (self.count - 1 not in self._run and self._since >= p.first_trial))
        freed = (len(self._free) == self._free.maxlen and statistics.fmean(self._free) >= p.free_cores
                 and self._since >= self._free_wait)
        up = self.count < self.top and (self._since >= self._wait[+1] or freed)
        if (down or up) and self._recent:
            self._trying = self.count - 1 if down else self.count + 1
            self._on_free = not down and self._since < self._wait[+1]
            self._level = level
            self._tried, self._after = [], []             # _recent stays as it was until the try ends
            self._seen = 0
        return Decision(self.wanted, True)

    def _try_step(self, slowness: float) -> Decision:
        """A forward at the count on trial: after SKIP + try_steps of them, back to the count in use for as
        many; a try that is plainly worse than the count in use stops at once."""
        self._seen += 1
        if self._seen <= SKIP:
            return Decision(self.wanted, False)
        self._tried.append(slowness)
        before = list(self._recent)
        tried = statistics.fmean(self._tried)
        late = statistics.fmean(before[-LOOKBACK:])
        if tried > self.piloting.abort_factor * max(statistics.fmean(before), late):
            return self._end_try(won=False)
        if len(self._tried) >= LOOKBACK and (
                tried * self.piloting.abort_factor < min(statistics.fmean(before[len(before) // 2:]), late)):
            return self._end_try(won=True)
        if len(self._tried) >= self.piloting.try_steps:
            self._back, self._seen = True, 0
        return Decision(self.wanted, False)

    def _back_step(self, slowness: float) -> Decision:
        """A forward at the count in use right after a try: the try is judged against these and the ones
        before it together."""
        self._seen += 1
        if self._seen <= SKIP:
            return Decision(self.wanted, True)
        self._after.append(slowness)
        if len(self._after) < self.piloting.try_steps:
            return Decision(self.wanted, True)
        self._end_try(statistics.fmean(self._tried) < statistics.fmean([*self._recent, *self._after]))
        return Decision(self.wanted, True)

    def _end_try(self, won: bool) -> Decision:
        p = self.piloting
        direction = +1 if self._trying > self.count else -1
        if won:
            self.count = self._trying
            self.switches += 1
            self._recent.clear()
            self._recent.extend(self._tried)
            self._own.clear()
            self._wait = {-1: 0, +1: p.probe_every}
            self._free_wait = p.free_wait
            self._lost_level = 0.0
        else:
            if direction < 0:
                self._lost_level = self._level
            if self._on_free:
                self._free_wait = min(p.wait_max, 2 * self._free_wait)
            else:
                self._wait[direction] = min(p.wait_max, max(p.probe_every, 2 * self._wait[direction]))
            self._recent.extend(self._after)
        self._skip = SKIP if won == self._back else 0       # the next forward changes the count
        self._free.clear()
        self._trying, self._back = None, False
        self._since = 0
        return Decision(self.wanted, False)
