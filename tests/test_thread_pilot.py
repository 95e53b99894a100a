"""The thread pilot's decisions (speczoo/thread_pilot.py) on synthetic forward times, no clock: it stays at
the top on a quiet machine, drops a thread within a few forwards of another program taking a core (also
when that shows as rare long stalls, as measured on a 2-core Zen 4), takes the core back once it is free,
keeps its probes cheap while the core stays taken, meets a core taken at once even after a quiet drift made
its trials lose, and compares forwards of different sizes through their own best times."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from speczoo.thread_pilot import LOOKBACK, PILOTING, SKIP, Piloting, ThreadPilot

QUIET = {1: 0.034, 2: 0.020}       # seconds of a 1-row forward: two threads 1.7x one, as on two cores
HOG = {1: 0.055, 2: 0.083}         # a busy loop on one of the two cores: 0.62x and 0.42x of quiet 2 threads
LOOK = SKIP + 1                    # forwards of a try of a plainly worse count: the change, one judged


def stalls(n: int, s: int, i: int) -> float:
    """A busy loop on one of two cores as the 0.5B's decode met it on a Zen 4 (/work/notes/trace.py's
    shape): two threads ~1.8x their quiet time and one forward in nine stalled ~6x more; one thread 1.6x,
    steady. The median of two threads' forwards is near one thread's, their mean 1.5x it."""
    if n == 1:
        return 0.033 * (1 + 0.05 * ((i * 7) % 5) / 4)
    return 0.200 if i % 9 == 4 else 0.036 * (1 + 0.05 * ((i * 3) % 5) / 4)


def drive(pilot: ThreadPilot, seconds: Callable[[int, int, int], float], forwards: int,
          sizes: Callable[[int], int] = lambda i: 1, start: int = 0,
          free: Callable[[int], float | None] = lambda n: None) -> list[tuple[int, bool]]:
    """Run `forwards` forwards through the pilot, the i-th of sizes(i) rows taking seconds(n, s, i) on the
    count the pilot asked for, free(n) cores idle meanwhile; returns (count it ran on, settled) per forward."""
    ran = []
    n = pilot.wanted
    for i in range(start, start + forwards):
        s = sizes(i)
        decision = pilot.observe(n, s, seconds(n, s, i), free(n))
        ran.append((n, decision.settled))
        n = decision.threads
    return ran


def noisy(table: dict[int, float], seed: int = 0, spread: float = 0.05) -> Callable[[int, int, int], float]:
    rng = random.Random(seed)
    return lambda n, s, i: table[n] * s ** 0.5 * (1 + spread * rng.random())


def test_a_quiet_machine_stays_at_the_top_after_one_look_at_one_thread_fewer():
    pilot = ThreadPilot(2)
    ran = drive(pilot, noisy(QUIET), 3000)
    assert pilot.count == 2 and pilot.switches == 0
    at_one = [i for i, (n, _) in enumerate(ran) if n == 1]
    assert at_one == list(range(PILOTING.first_trial, PILOTING.first_trial + LOOK))    # one look, cut short
    assert all(settled for n, settled in ran if n == 2) and not any(settled for n, settled in ran if n == 1)


def test_a_core_taken_drops_a_thread_within_a_few_forwards_and_a_core_freed_is_taken_back():
    pilot = ThreadPilot(2)
    drive(pilot, noisy(QUIET), 100)
    busy = drive(pilot, noisy(HOG, 1), 400, start=100)
    first_at_one = next(i for i, (n, settled) in enumerate(busy) if n == 1 and settled)
    # the slow ones that make the window's median slow, the trial, back
    assert first_at_one <= PILOTING.window // 2 + 1 + 2 * (SKIP + PILOTING.try_steps)
    assert pilot.count == 1
    # the probes of two threads under the busy loop: each the change and one forward (aborted), waits doubling
    at_two = [i for i, (n, _) in enumerate(busy) if i > first_at_one and n == 2]
    assert len(at_two) <= 4 * LOOK and all(not busy[i][1] for i in at_two)
    probes = [i for i in at_two if i - 1 not in at_two]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and all(g <= PILOTING.wait_max + 1 for g in gaps)
    freed = drive(pilot, noisy(QUIET, 2), PILOTING.wait_max + 2 * (SKIP + PILOTING.try_steps), start=500)
    assert pilot.count == 2 and freed[-1] == (2, True)


def test_probes_under_a_lasting_load_cost_little():
    pilot = ThreadPilot(2)
    drive(pilot, noisy(QUIET), 100)
    ran = drive(pilot, noisy(HOG, 3), 5000, start=100)
    lost = sum(HOG[n] - HOG[1] for n, _ in ran) / (len(ran) * HOG[1])
    assert lost < 0.01                        # the time the probes and the first few forwards cost
    assert sum(n == 2 for n, _ in ran[100:]) <= (5000 / PILOTING.wait_max + 3) * LOOK


def test_an_idle_core_is_taken_back_within_a_few_forwards_and_a_busy_one_is_not_probed_early():
    pilot = ThreadPilot(2)
    drive(pilot, noisy(QUIET), 100)
    busy = drive(pilot, noisy(HOG, 1), 300, start=100, free=lambda n: 0.0)     # both cores busy
    assert pilot.count == 1
    at_two = [i for i, (n, _) in enumerate(busy) if n == 2 and i > PILOTING.window + 2 * (SKIP + PILOTING.try_steps)]
    assert len(at_two) <= 300 // PILOTING.probe_every * LOOK
    freed = drive(pilot, noisy(QUIET, 2), 30, start=400, free=lambda n: 1.0 if n == 1 else 0.0)
    back = next(i for i, (n, settled) in enumerate(freed) if n == 2 and settled)
    assert back <= PILOTING.free_wait + 2 * (SKIP + PILOTING.try_steps) and pilot.count == 2


def test_idle_cores_that_one_more_thread_cannot_use_cost_little():
    """/proc/stat shows cores idle that this process may not use (a CPU quota): the probes they start
    lose, and their wait doubles."""
    pilot = ThreadPilot(2)
    drive(pilot, noisy(QUIET), 100)
    ran = drive(pilot, noisy(HOG, 4), 5000, start=100, free=lambda n: 1.0)
    assert pilot.count == 1
    lost = sum(HOG[n] - HOG[1] for n, _ in ran) / (len(ran) * HOG[1])
    assert lost < 0.01


def test_a_process_started_under_load_finds_the_faster_count():
    pilot = ThreadPilot(2)
    drive(pilot, noisy(HOG), 60)
    assert pilot.count == 1


def test_short_noise_bursts_on_a_quiet_machine_cost_nothing_and_a_long_one_one_trial_that_loses():
    pilot = ThreadPilot(2)
    drive(pilot, noisy(QUIET), 100)
    short = lambda n, s, i: QUIET[n] * (2.0 if 100 <= i < 103 or 300 <= i < 303 else 1.0)   # noqa: E731
    assert all(n == 2 for n, _ in drive(pilot, short, 400, start=100))
    burst = PILOTING.window * 3 // 4
    long = lambda n, s, i: QUIET[n] * (2.0 if 500 <= i < 500 + burst else 1.0)   # noqa: E731
    ran = drive(pilot, long, 400, start=500)
    at_one = [i + 500 for i, (n, _) in enumerate(ran) if n == 1]
    assert pilot.count == 2 and pilot.switches == 0
    # one trial, started inside the burst: cut short, or judged against the quiet forwards after it too
    assert 500 + PILOTING.window // 2 <= at_one[0] and at_one == list(range(at_one[0], at_one[-1] + 1))
    assert len(at_one) <= SKIP + PILOTING.try_steps


def test_a_core_taken_that_shows_as_rare_long_stalls_drops_a_thread():
    pilot = ThreadPilot(2)
    drive(pilot, noisy(QUIET), 100)
    ran = drive(pilot, stalls, 2000, start=100)
    assert pilot.count == 1
    first_at_one = next(i for i, (n, settled) in enumerate(ran) if n == 1 and settled)
    assert first_at_one <= PILOTING.window + 2 * (SKIP + PILOTING.try_steps) + 1
    spent = sum(stalls(n, 1, i + 100) for i, (n, _) in enumerate(ran))
    assert spent < 1.05 * sum(stalls(1, 1, i + 100) for i in range(2000))    # near one thread all along


def drift_then_hog(hog_from: int) -> Callable[[int, int, int], float]:
    """The 1.5B's greedy decode on a 2-core Zen 3 (/work/notes/pilot/trace.py's shape): quiet, two threads
    start at 40 ms and drift to 60 ms (1.5x their best: trials of one thread start and lose, and their
    wait doubles to its most), one thread 95 ms; from forward `hog_from` a busy loop on one core: two
    threads 100 ms and every third forward 220 ms, one thread 95 ms as before."""
    def seconds(n: int, s: int, i: int) -> float:
        jitter = 1 + 0.04 * ((i * 7) % 5) / 4
        if n == 1:
            return 0.095 * jitter
        if i >= hog_from:
            return (0.220 if i % 3 == 0 else 0.100) * jitter
        return (0.040 if i < 50 else 0.060) * jitter
    return seconds


def test_a_core_taken_after_a_drift_lost_trials_is_met_at_once_not_after_their_doubled_wait():
    hog_from = 3000
    pilot = ThreadPilot(2)
    quiet = drive(pilot, drift_then_hog(hog_from), hog_from)
    assert pilot.count == 2 and sum(n == 1 for n, _ in quiet) > 4 * LOOK    # the drift's trials, each lost
    busy = drive(pilot, drift_then_hog(hog_from), 200, start=hog_from)
    first_at_one = next(i for i, (n, settled) in enumerate(busy) if n == 1 and settled)
    # the slow forwards that tip the window's median, then a trial that wins after LOOKBACK judged forwards
    # (no forwards back at two threads): the wait that the drift's lost trials doubled is not waited out
    assert first_at_one <= PILOTING.window // 2 + 2 + SKIP + LOOKBACK
    trial = [n for n, _ in busy[first_at_one - SKIP - LOOKBACK:first_at_one]]
    assert trial == [1] * (SKIP + LOOKBACK) and pilot.count == 1


def test_a_try_plainly_faster_wins_without_forwards_back_at_the_slower_count():
    pilot = ThreadPilot(2)
    drive(pilot, noisy(QUIET), 100)
    busy = drive(pilot, noisy(HOG, 1), 60, start=100)
    start = next(i for i, (n, _) in enumerate(busy) if n == 1)
    assert busy[start:start + SKIP + LOOKBACK] == [(1, False)] * (SKIP + LOOKBACK)
    assert all(n == 1 for n, _ in busy[start:]) and all(settled for _, settled in busy[start + SKIP + LOOKBACK:])


def test_a_process_started_under_stalls_finds_the_faster_count():
    pilot = ThreadPilot(2)
    drive(pilot, stalls, 80)
    assert pilot.count == 1


def test_forwards_of_different_sizes_are_compared_through_their_own_best():
    """Speculative rounds: S = 1 and S = 9 interleaved, a 9-row forward 3x a 1-row one; the trial under
    the busy loop meets other sizes than the forwards it is compared with."""
    pilot = ThreadPilot(2)
    sizes = lambda i: 9 if i % 3 else 1     # noqa: E731
    cost = lambda table: lambda n, s, i: table[n] * (3.0 if s == 9 else 1.0)   # noqa: E731
    drive(pilot, cost(QUIET), 90, sizes)
    drive(pilot, cost(HOG), 60, sizes, start=90)
    assert pilot.count == 1
    drive(pilot, cost(QUIET), PILOTING.wait_max + 10, sizes, start=120)
    assert pilot.count == 2


def test_four_cores_with_one_taken_settle_on_three_threads():
    def seconds(n, s, i):
        # quiet: work split evenly; with a core taken, a team of 4 waits on the shared core
        return 0.1 / n if i < 200 or n < 4 else 0.1 / 4 * 2.5

    pilot = ThreadPilot(4)
    ran = drive(pilot, seconds, 1000)
    assert pilot.count == 3
    assert sum(n == 4 for n, _ in ran[220:]) <= 1000 / PILOTING.probe_every * LOOK


def test_a_count_the_pilot_did_not_ask_for_is_recorded_and_the_pilots_comes_back():
    pilot = ThreadPilot(2)
    drive(pilot, noisy(QUIET), 5)
    d = pilot.observe(1, 1, 0.5)
    assert d.threads == 2 and not d.settled and pilot.count == 2
    d = pilot.observe(7, 1, 0.02)                   # above the top: taken as the top
    assert d.threads == 2 and d.settled


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan, math.inf])
def test_a_forward_without_a_real_time_is_ignored(seconds):
    pilot = ThreadPilot(2)
    assert pilot.observe(2, 1, seconds).threads == 2
    assert pilot.observe(2, 0, 0.02).threads == 2
    assert not pilot.observe(2, 1, seconds).settled


def test_one_thread_at_the_top_never_changes():
    pilot = ThreadPilot(1)
    assert all(n == 1 for n, _ in drive(pilot, noisy({1: 0.05}), 200))


def test_bad_settings_are_errors():
    with pytest.raises(ValueError, match="at least 1"):
        ThreadPilot(0)
    with pytest.raises(ValueError, match="slow_factor must be > 1"):
        Piloting(slow_factor=1.0)
    with pytest.raises(ValueError, match="free_cores must be > 0"):
        Piloting(free_cores=0.0)
    with pytest.raises(ValueError, match="wait_max must be >= probe_every"):
        Piloting(probe_every=64, wait_max=32)
    with pytest.raises(ValueError, match="try_steps must be >= 1"):
        Piloting(try_steps=0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        Piloting(window=0)
