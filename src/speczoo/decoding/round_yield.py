"""What a confident drafter's own rounds yielded: tokens per round over their cost, as a running mean.

A chain is priced by one α per position (decoding/acceptance.py): K tokens, each a full draft step, a
truncated geometric run of acceptances. A drafter that stops on its own confidence (a draft model) does
not draft like that: it drafts deep where it is sure and stops where it is not, so its misses cluster in
short rounds. The α model under-prices it, most where its confidence varies most (prose, arithmetic), and
prompt lookup's rounds take the floor from it there. The controller (decoding/controller.py) also prices
it by what its rounds showed: the running mean of their tokens (accepted + 1) over the running mean of
their cost in target steps (each drafted token at a full draft step, as the α model charges it), and
takes the better of the two.
What that bought: docs/tuning.md (`yield_weight`).

Pure arithmetic: never touches a model, a cache or a clock.
"""

from __future__ import annotations


class RoundYield:
    """Running means of a drafter's tokens per round and cost per round.

    weight: the weight of the latest round in each mean (an EWMA: the text changes).
    least:  rounds before the means are used (`rate` is None until then).
    """

    def __init__(self, weight: float, least: int):
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"the round-yield weight must be in (0, 1], got {weight}")
        if least < 1:
            raise ValueError(f"the round yield needs at least one round, got {least}")
        self.weight, self.least = weight, least
        self.tokens = self.cost = 0.0
        self.rounds = 0

    def update(self, tokens: int, cost: float) -> None:
        """A round emitted `tokens` (accepted + 1) for `cost` target steps (drafting, verify, overhead)."""
        w = 1.0 if self.rounds == 0 else self.weight
        self.tokens = (1.0 - w) * self.tokens + w * tokens
        self.cost = (1.0 - w) * self.cost + w * cost
        self.rounds += 1

    def rate(self, extra: float = 0.0) -> float | None:
        """Tokens per target step of its rounds with `extra` steps more per round (a catch-up), or None
        before `least` rounds."""
        if self.rounds < self.least:
            return None
        return self.tokens / (self.cost + extra)
