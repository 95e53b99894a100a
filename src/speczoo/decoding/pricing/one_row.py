"""Whether a model's one-row forwards should prefetch their weights in software, timed both ways here.

A one-row forward (a greedy step, a draft model's step) streams every weight once and computes little per
byte. Whether the CPU's hardware prefetchers alone keep that stream at the memory's pace depends on the CPU:
on a Zen 4 the kernels' software prefetch only took their fill buffers (3-9% slower), on an Intel Xeon it
made the 1.5B's one-row forward 6-10% faster (docs/results.md, "The one-row prefetch, timed per machine"). A
build-time choice is wrong on one of them, so a model's cost profile times both, alternating in blocks so
that the machine's slow and fast phases fall on both sides, and keeps the prefetch only when it won every
round and saved Pricing.one_row_margin of the time overall; otherwise the default (none). The choice
changes no bit of any result (the kernels' tests run both), only the time: the model applies it before each
forward (models/base.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from speczoo.decoding.tuning import PRICING, Pricing


@dataclass(frozen=True)
class OneRowTiming:
    """How a one-row forward was timed both ways, and what it chose.

    ms: the median milliseconds of a one-row forward without ("none") and with ("prefetch") the software
    prefetch, over every timed forward; rounds: the rounds timed (a block of forwards each way in each).
    """

    prefetch: bool
    ms: dict[str, float]
    rounds: int

    def to_json(self) -> dict:
        return {"prefetch": self.prefetch, "ms": {k: round(v, 3) for k, v in self.ms.items()}, "rounds": self.rounds}

    @staticmethod
    def from_json(data) -> OneRowTiming | None:
        """What to_json wrote, or None for anything else (a profile from before the choice was timed)."""
        try:
            ms = {k: float(data["ms"][k]) for k in ("none", "prefetch")}
            return OneRowTiming(bool(data["prefetch"]), ms, int(data["rounds"]))
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        none, pf = self.ms["none"], self.ms["prefetch"]
        verdict = "kept" if self.prefetch else "left out"
        return (f"one-row software prefetch {verdict}: {pf:.2f} ms with it, {none:.2f} ms without "
                f"({(pf / none - 1) * 100:+.1f}%, {self.rounds} rounds)")


def time_one_row(model, forward: Callable[[], float], pricing: Pricing = PRICING,
                 max_s: float | None = None) -> OneRowTiming | None:
    """Time `forward` (one one-row forward of `model`, returning its milliseconds) both ways, in up to
    pricing.one_row_rounds rounds of pricing.one_row_block forwards each way (fewer where one_row_max_s, or
    max_s when given and less, would not hold them, counted in the forwards' own milliseconds), and leave
    model.one_row_prefetch (what its forwards set the kernels to) at the choice: the prefetch when it won
    every round and saved one_row_margin of the time overall. None (the model as it was) when fewer than two
    rounds fit."""
    before = model.one_row_prefetch
    times: dict[bool, list[float]] = {False: [], True: []}
    spent = forward()                        # the first touch of every weight: an upper bound on a forward
    wins = rounds = 0
    cap_ms = 1000 * (pricing.one_row_max_s if max_s is None else min(pricing.one_row_max_s, max_s))
    for r in range(pricing.one_row_rounds):
        per_round = 2 * pricing.one_row_block * statistics.median(times[False] + times[True] or [spent])
        if spent + per_round > cap_ms:
            break
        medians = {}
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            model.one_row_prefetch = on
            block = [forward() for _ in range(pricing.one_row_block)]
            times[on] += block
            medians[on] = statistics.median(block)
            spent += sum(block)
        wins += medians[True] < medians[False]
        rounds += 1
    if rounds < 2:
        model.one_row_prefetch = before
        return None
    ms = {"none": statistics.median(times[False]), "prefetch": statistics.median(times[True])}
    keep = wins == rounds and ms["prefetch"] <= ms["none"] * (1 - pricing.one_row_margin)
    model.one_row_prefetch = keep
    return OneRowTiming(keep, ms, rounds)
