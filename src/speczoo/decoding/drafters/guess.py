"""Prompt-lookup guesses that make a draft model's own chain cheaper to produce.

A draft model proposes its chain one forward per token. Where the text copies earlier text (a code edit,
a quoted passage), prompt lookup already knows what the draft will most likely say next, so the drafter
feeds those guessed ids along with its next step: the forward's extra rows give the draft's token after
each guessed id, and every guess the draft agrees with is a draft token that needs no forward of its own.
The chain is the draft's own either way (a guess it disagrees with is dropped from its cache), so the
proposals, and everything the target makes of them, are unchanged: only the draft's time changes.

Extra rows are not free (a forward over several rows costs several of the draft's steps on some kernel
paths: docs/results.md), so the guess is sized per round like a speculative round: the length g that maximizes E(α, g) / rows(g + 1), the
draft tokens expected from one forward over its cost (decoding/pricing/cost.py), with α the running rate at which
the draft has confirmed guessed ids in this prompt-lookup situation (NgramIndex.situation; it starts
at the target's rate there, Drafting.situation_priors) and rows the draft's own forward-cost curve. Pure
bookkeeping: no model, no cache, no clock.
"""

from __future__ import annotations

from speczoo.decoding.acceptance import AcceptanceEstimate
from speczoo.decoding.pricing.cost import CvCurve, as_curve, best_k
from speczoo.decoding.drafters.ngram import NgramIndex
from speczoo.decoding.tuning import DRAFTING, Drafting


class Guesser:
    """Sized prompt-lookup guesses for one generation's draft chain.

    rows:      the draft model's forward cost over S rows relative to one row (its own c_v curve).
    guess_max: the most guessed ids fed with one forward.
    drafting:  the guesses' constants (Drafting: guess_order, situation_priors, guess_prior).
    """

    def __init__(self, rows: CvCurve | float, guess_max: int, drafting: Drafting = DRAFTING):
        if guess_max < 1:
            raise ValueError(f"guess_max must be >= 1, got {guess_max}")
        self.rows = as_curve(rows)
        top = self.rows.max_s
        self.guess_max = guess_max if top is None else min(guess_max, top - 1)
        self.order = drafting.guess_order
        self.priors, self.prior = drafting.situation_priors, drafting.guess_prior
        self.reset()

    def reset(self) -> None:
        """A new sequence: an empty index, the confirmation rates back at their priors."""
        self.index = NgramIndex(self.order)
        self.estimates: dict[str, AcceptanceEstimate] = {}
        self._judged: AcceptanceEstimate | None = None      # the estimate the pending guess reports to

    def guess(self, context: list[int], drafted: list[int], n: int) -> list[int]:
        """Up to n ids to feed after `drafted` (the draft's tokens so far this round) on `context` (every
        committed id): [] when nothing matches or no guess is expected to pay for its rows."""
        self._judged = None
        n = min(n, self.guess_max)
        if n < 1:
            return []
        self.index.follow(context)
        situation, ids = self.index.ahead(drafted, n)
        if situation is None:
            return []
        est = self.estimates.get(situation)
        if est is None:
            est = self.estimates[situation] = AcceptanceEstimate(prior_alpha=self.priors.get(situation, self.prior))
        best = best_k(est.alpha, self.rows, 0.0, n)
        if best.speedup <= 1.0:                      # one row alone is the cheaper way to the next token
            return []
        self._judged = est
        return ids[: best.k]

    def judge(self, guessed: int, confirmed: int, censored: bool) -> None:
        """The last guess of `guessed` ids: the draft agreed with its first `confirmed`; censored: the
        chain ended there, so whether the draft would have agreed with the next guessed id is unknown."""
        if self._judged is not None and guessed:
            self._judged.update(confirmed if censored else guessed, confirmed)
            self._judged = None
