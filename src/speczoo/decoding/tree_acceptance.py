"""A running estimate of how many tokens a token-tree drafter gets accepted, per node budget N.

A chain's rounds are priced by one α per position (decoding/acceptance.py): its K tokens are accepted
like a truncated geometric run. A tree's are not: its N nodes are spread over branches, so what N more
nodes buy depends on how the drafter spends them (deeper on one branch, or another branch at depth 1).
So a tree drafter is priced by what its own rounds showed: a(N), the accepted tokens of its tree cut to
its first N nodes, averaged over its rounds in a situation (the controller keeps one per (drafter,
situation), as it keeps the chains' α).

One round shows a(N) for every N up to the nodes it drafted: a drafter's tree of N nodes is the first N
nodes of its tree of more (its nodes come best first, every parent before its children; ngram_tree.py
expands best first), and with greedy verification the accepted path of the cut tree is the path's nodes
that fall in the cut. Larger N, not drafted, learn nothing from the round. Each N's mean is shrunk towards
the chain's geometric run at the situation's prior α, E(α, N) − 1, and old rounds fade per judged token
as the chain's evidence does.

Pure arithmetic: never touches a model, a cache or a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from speczoo.decoding.acceptance import fade_per_token
from speczoo.decoding.pricing.cost import expected_tokens


class TreeAcceptance:
    """Faded mean accepted tokens a(N) of a tree drafter's rounds, for node budgets N = 1..k_max.

    half_life:    judged draft tokens after which a round counts half (as AcceptanceEstimate's).
    prior_alpha:  the situation's prior α: before any round, a(N) is a chain's E(prior_alpha, N) − 1.
    prior_weight: how many rounds that prior is worth.
    """

    def __init__(self, k_max: int, half_life: float = 32.0, prior_alpha: float = 0.5, prior_weight: float = 2.0):
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max = k_max
        self.decay = fade_per_token(half_life, prior_alpha, prior_weight)
        self.prior = [expected_tokens(prior_alpha, n) - 1.0 for n in range(k_max + 1)]
        self.prior_weight = prior_weight
        self.sums = [0.0] * (k_max + 1)      # faded Σ a(N) over the rounds that drafted N nodes or more
        self.rounds = [0.0] * (k_max + 1)    # faded count of those rounds

    def update(self, nodes: int, path: Sequence[int], judged: int) -> None:
        """A round drafted a tree (or a chain) of `nodes` nodes and the target accepted the nodes `path`
        (indices into the draft, root to leaf); `judged`: the draft tokens it ruled on, which set the fade."""
        if nodes == 0:
            return
        if len(path) > nodes or any(not 0 <= i < nodes for i in path):
            raise ValueError(f"an accepted path {list(path)} must index a draft of {nodes} nodes")
        fade = self.decay ** judged
        for n in range(1, self.k_max + 1):
            self.sums[n] *= fade
            self.rounds[n] *= fade
        for n in range(1, min(nodes, self.k_max) + 1):
            self.sums[n] += sum(1 for i in path if i < n)
            self.rounds[n] += 1.0

    def accepted(self, n: int) -> float:
        """The estimated mean accepted tokens of an n-node tree (never less than a smaller tree's)."""
        return max(self._mean(m) for m in range(1, self._check(n) + 1))

    def expected_tokens(self, n: int) -> float:
        """Tokens a round with an n-node tree emits on the estimate: its accepted ones plus the target's own."""
        return 1.0 + self.accepted(n)

    def optimistic_tokens(self, n: int, z: float, ceiling: float) -> float:
        """The tokens of an n-node tree at an optimistic estimate: each budget's mean plus z standard
        errors (a(N) lies in [0, N], so its variance is at most m·(N − m)), capped at what a chain of n
        at α = `ceiling` would get; never less than the estimate itself or a smaller tree's."""
        best = 0.0
        for m in range(1, self._check(n) + 1):
            mean = self._mean(m)
            se = math.sqrt(max(0.0, mean * (m - mean)) / (self.rounds[m] + self.prior_weight))
            best = max(best, mean, min(expected_tokens(ceiling, m) - 1.0, mean + z * se))
        return 1.0 + best

    def _mean(self, n: int) -> float:
        w = self.prior_weight
        return (self.sums[n] + self.prior[n] * w) / (self.rounds[n] + w)

    def _check(self, n: int) -> int:
        if not 1 <= n <= self.k_max:
            raise ValueError(f"a node budget must be in 1..{self.k_max}, got {n}")
        return n
