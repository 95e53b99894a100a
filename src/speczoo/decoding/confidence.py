"""How far a confident drafter's word holds: its stated probabilities fitted to what the target accepts.

A draft model's probability for its own token (the softmax of its argmax, or q of a token it sampled)
is not the chance that the target keeps it. A small draft trained apart from its target can be far less
sure than it is right (its probabilities spread over phrasings the target would never pick), or more
sure than it is right; which, and how much, depends on the pair and on the text. The controller's floors
speak of the target's acceptance (a chain's chance to survive, decoding/controller.py), so the draft's
confidence is read through a fit: P(accepted | p) = p^γ, with γ chosen so that the judged tokens' p^γ
add up to the tokens the target accepted (calibrated in the mean), old evidence fading per judged token
and the fit shrunk towards γ = 1 (the confidence taken at its word) while it rests on few tokens.

One exponent maps a chain's product as well as a token's: Π p^γ = (Π p)^γ, so a floor f on the fitted
survival is the floor f^(1/γ) on the drafter's own product (`floor`), and the drafter's stop rule stays
exactly what it was. The fit decides only where a chain stops, never which tokens are proposed or
kept: the verify rules, and so the output, are unchanged.

Pure arithmetic: never touches a model, a cache or a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# γ is looked for in [LOWEST, HIGHEST]: a confidence read as far more (γ = 0.1: p = 0.5 -> 0.93) or far
# less (γ = 4: p = 0.9 -> 0.66) than it says, never beyond
LOWEST, HIGHEST = 0.1, 4.0
_STEPS = 40          # bisection steps in log γ: (log HIGHEST - log LOWEST) / 2^40, far below any use


class ConfidenceFit:
    """The exponent γ of one drafter's confidences (P(accepted | p) = p^γ), from the tokens judged.

    half_life:    judged tokens after which a piece of evidence counts half.
    prior_weight: how many judged tokens the prior γ = 1 is worth (the fit's log γ is shrunk by
                  n / (n + prior_weight) for n tokens of faded evidence).
    window:       the most judged tokens kept (the oldest, faded the most, are dropped first).
    """

    def __init__(self, half_life: float = 64.0, prior_weight: float = 16.0, window: int = 256):
        if half_life <= 0 or prior_weight <= 0 or window < 1:
            raise ValueError(f"need half_life > 0, prior_weight > 0 and window >= 1, got {half_life}, "
                             f"{prior_weight}, {window}")
        self.decay = 0.5 ** (1.0 / half_life)
        self.prior_weight = prior_weight
        self.window = window
        self._logp = np.zeros(0)        # log p of each judged token, oldest first
        self._kept = np.zeros(0)        # 1.0 where the target accepted it
        self._weight = np.zeros(0)      # its faded weight
        self.exponent = 1.0             # γ, refitted after each update

    @property
    def evidence(self) -> float:
        """Judged tokens (faded) the fit rests on."""
        return float(self._weight.sum())

    def floor(self, f: float) -> float:
        """The floor on the drafter's own confidence product that a floor `f` on the fitted survival
        means: f^(1/γ) (f itself where f <= 0 or f >= 1: never or always met either way)."""
        if f <= 0.0 or f >= 1.0:
            return f
        return f ** (1.0 / self.exponent)

    def update(self, confidences: Sequence[float], judged: int, accepted: int) -> None:
        """A round's draft gave its tokens `confidences` (one per token, in order); the target ruled on the
        first `judged` of them and kept the first `accepted`. Tokens past the first rejected one were not
        judged on their own and teach nothing; a token with no confidence (p <= 0) is left out too."""
        if not 0 <= accepted <= judged:
            raise ValueError(f"need 0 <= accepted <= judged, got accepted={accepted}, judged={judged}")
        n = min(judged, accepted + 1, len(confidences))
        p = np.asarray(confidences[:n], dtype=np.float64)
        ok = p > 0.0
        if not ok.any():
            return
        kept = (np.arange(n) < accepted).astype(np.float64)[ok]
        logp = np.log(np.minimum(p[ok], 1.0))
        m = len(logp)
        self._weight = np.concatenate((self._weight * self.decay ** m, self.decay ** np.arange(m - 1, -1, -1.0)))
        self._logp = np.concatenate((self._logp, logp))
        self._kept = np.concatenate((self._kept, kept))
        if len(self._logp) > self.window:
            self._logp, self._kept, self._weight = (a[-self.window:] for a in (self._logp, self._kept, self._weight))
        self.exponent = self._fit()

    def _fit(self) -> float:
        """γ with Σ w p^γ = Σ w kept (bisection in log γ: the sum falls as γ grows), shrunk towards 1."""
        w, logp = self._weight, self._logp
        target = float(w @ self._kept)
        lo, hi = math.log(LOWEST), math.log(HIGHEST)
        for _ in range(_STEPS):
            mid = 0.5 * (lo + hi)
            if float(w @ np.exp(math.exp(mid) * logp)) > target:
                lo = mid          # the fit still promises more than was kept: read it more strictly
            else:
                hi = mid
        n = float(w.sum())
        return math.exp(0.5 * (lo + hi) * n / (n + self.prior_weight))
