"""How long each drafter keeps the floor once chosen: the running mean of its runs of rounds.

A run is a stretch of consecutive rounds that end up with the same drafter. The controller spreads a
lagging draft model's catch-up over the rounds it is then expected to keep the floor (Tuning.spread_rounds,
at least), and this is that expectation.

Pure bookkeeping: no model, no clock.
"""

from __future__ import annotations


class RunLengths:
    """mean[d]: the running mean of drafter d's runs, in rounds (`prior` until one has ended); the
    latest run counts with `weight` (an EWMA: runs change with the text)."""

    def __init__(self, names: list[str], prior: float, weight: float):
        if not prior > 0:
            raise ValueError(f"the run-length prior must be > 0 rounds, got {prior}")
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"the run-length weight must be in (0, 1], got {weight}")
        self.mean = {d: prior for d in names}
        self.weight = weight
        self.current = ""           # the drafter of the run in progress ("" before the first round)
        self.length = 0             # its rounds so far

    def expected(self, drafter: str) -> float:
        """Rounds `drafter` is expected to keep the floor when chosen now."""
        return self.mean[drafter]

    def round(self, drafter: str) -> None:
        """A round ended up with `drafter` (any name; plain decoding included)."""
        if drafter == self.current:
            self.length += 1
            return
        if self.current in self.mean:
            w = self.weight
            self.mean[self.current] = (1.0 - w) * self.mean[self.current] + w * self.length
        self.current, self.length = drafter, 1
