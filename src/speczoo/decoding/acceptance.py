"""A running estimate of a drafter's per-position acceptance α, from what each round kept.

In a round with K drafted tokens the accepted count a is a truncated geometric sample: a successes,
then one failure unless a = K. So the estimate is successes / trials with trials = a + [a < K] (the
maximum-likelihood estimate; accepted/drafted would be biased low), shrunk towards a prior, with old
evidence fading per judged token. The controller keeps one per (drafter, situation)
(decoding/controller.py); the draft model's prompt-lookup guesses keep their own
(decoding/drafters/guess.py).

Pure arithmetic: never touches a model, a cache or a clock.
"""

from __future__ import annotations

import math


def fade_per_token(half_life: float, prior_alpha: float, prior_weight: float) -> float:
    """The fade per judged draft token of an estimate with this half-life, once its arguments are checked
    (a half-life and a prior weight > 0, a prior α in (0, 1))."""
    if half_life <= 0:
        raise ValueError(f"half_life must be > 0 judged tokens, got {half_life}")
    if not 0.0 < prior_alpha < 1.0:
        raise ValueError(f"prior_alpha must be in (0, 1), got {prior_alpha}")
    if prior_weight <= 0:
        raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
    return 0.5 ** (1.0 / half_life)


class AcceptanceEstimate:
    """Exponentially weighted α of one drafter from (drafted, accepted) per round.

    half_life:    judged draft tokens after which a piece of evidence counts half. Fading per judged
                  token (not per round) gives the estimate about the same precision whatever α and K
                  are, and lets it follow a text that changes character.
    prior_alpha:  α before any evidence.
    prior_weight: how many judged tokens the prior is worth.
    """

    def __init__(self, half_life: float = 32.0, prior_alpha: float = 0.5, prior_weight: float = 2.0):
        self.decay = fade_per_token(half_life, prior_alpha, prior_weight)
        self.prior_alpha, self.prior_weight = prior_alpha, prior_weight
        self.successes = 0.0
        self.trials = 0.0

    @property
    def alpha(self) -> float:
        w = self.prior_weight
        return (self.successes + self.prior_alpha * w) / (self.trials + w)

    def upper(self, z: float, ceiling: float) -> float:
        """An optimistic α: the estimate plus z standard errors, at most `ceiling` (wide on little
        evidence, so a drafter that failed once early is tried again soon; tight once it has been judged
        on many tokens)."""
        a = self.alpha
        return min(ceiling, a + z * math.sqrt(a * (1.0 - a) / (self.trials + self.prior_weight)))

    def expected_tokens(self, k: int, least: float = 0.0) -> float:
        """E(α, K) averaged over what is known of α: the posterior Beta(a, b) of the (faded) evidence
        and the prior, whose moments are E[α^i] = Π_{j<i} (a + j) / (a + b + j). At least E at the
        estimate (E is convex in α), the more so the less is known. least: the posterior is taken as
        worth at least this many judged tokens (same mean), which caps what uncertainty alone adds."""
        a = self.successes + self.prior_alpha * self.prior_weight
        n = self.trials + self.prior_weight
        if n < least:
            a, n = a * least / n, least
        total = moment = 1.0
        for j in range(k):
            moment *= (a + j) / (n + j)
            total += moment
        return total

    def update(self, drafted: int, accepted: int) -> None:
        """A round drafted `drafted` tokens (0: no candidate, no evidence) and kept `accepted`."""
        if drafted == 0:
            return
        miss = 1 if accepted < drafted else 0
        fade = self.decay ** (accepted + miss)
        self.successes = fade * self.successes + accepted
        self.trials = fade * self.trials + accepted + miss
