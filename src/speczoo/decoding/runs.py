"""How long each drafter keeps the floor once chosen: the running mean of its runs of rounds.

A run is a stretch of consecutive rounds that end up with the same drafter (an empty draft that the
engine hands to the alternative counts for the alternative). The controller lets a confident drafter (a
draft model, which stops on its own confidence) draft as deep as k_max once its runs are DEEP_RUN rounds
long: then prompt lookup rarely takes a round from it, so a long chain preempts nothing, and a K capped
at the plan's (2 or 3 tokens at a first-token α of 0.6-0.7) leaves accepted tokens on the table. In
free-form writing or math the draft model's rounds emitted 1.65 tokens each under `auto` against 2.0
under `draft` alone, the gap that cost `auto` most of its 9% there (`python -m speczoo.bench.auto_replay`).

Pure bookkeeping: no model, no clock.
"""

from __future__ import annotations

# Before any run has ended a drafter is expected to keep the floor half a round: no deep chains until
# it has shown a run of several rounds (verbatim reproduction starts with rounds prompt lookup wins).
RUN_PRIOR = 0.5
RUN_WEIGHT = 0.5        # the weight of the latest run in the mean (an EWMA: runs change with the text)
RUN_CAP = 16.0          # the longest run the mean may promise
# Runs this long (in rounds, on the running mean) let a confident drafter draft up to k_max. Chosen with
# the offline replay of auto over the built-in prompts and two questions of each suite category at
# draft steps of 0.28 and 0.42 target steps: thresholds 1.5-2 gave +0.6 to +0.9 points of mean speedup
# against the best single drafter, 3-4 less, and none changed the worst case.
DEEP_RUN = 2.0


class RunLengths:
    """mean[d]: the running mean of drafter d's runs, in rounds (RUN_PRIOR until one has ended)."""

    def __init__(self, names: list[str], prior: float = RUN_PRIOR, weight: float = RUN_WEIGHT,
                 cap: float = RUN_CAP):
        if not prior > 0:
            raise ValueError(f"the run-length prior must be > 0 rounds, got {prior}")
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"the run-length weight must be in (0, 1], got {weight}")
        if not cap >= prior:
            raise ValueError(f"the run-length cap ({cap}) must be at least the prior ({prior})")
        self.mean = {d: prior for d in names}
        self.weight, self.cap = weight, cap
        self.current = ""           # the drafter of the run in progress ("" before the first round)
        self.length = 0             # its rounds so far

    def expected(self, drafter: str) -> float:
        """Rounds `drafter` is expected to keep the floor when chosen now (at most the cap)."""
        return min(self.cap, self.mean[drafter])

    def round(self, drafter: str) -> None:
        """A round ended up with `drafter` (any name; plain decoding included)."""
        if drafter == self.current:
            self.length += 1
            return
        if self.current in self.mean:
            w = self.weight
            self.mean[self.current] = (1.0 - w) * self.mean[self.current] + w * self.length
        self.current, self.length = drafter, 1
