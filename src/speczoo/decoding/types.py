"""Plain data exchanged between drafters, the pure verify functions and the engine.

A drafter returns a `Draft`; `decoding/verify/` turns (draft, target output) into a `Verdict`; only the
engine acts on a verdict (emits tokens, rolls caches back). Nothing here touches a model or a cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

MAX_K = 64      # the most draft tokens one round may propose: caches are preallocated for it (Engine)


@dataclass
class Draft:
    """K proposed tokens following the last committed token.

    tokens: the K draft ids (K may be 0: nothing to propose this round).
    probs:  [K, V] the drafter's distribution q at each step (sampling verify); None for greedy or
            for n-gram drafts, which count as one-hot q.
    parents: for a token tree, parents[i] is the index of node i's parent in `tokens` (-1: the root,
            i.e. the last committed token); None for a chain.
    work:   what proposing it took, in the drafter's own steps (a draft model: its forwards, each
            counted at its cost over its rows; decoding/pricing/calibrate.py prices a step from it); None: one
            step per token.
    confidences: a drafter that stops on its confidence (Drafter.stops_on_confidence): the probability
            it gave each token (the argmax's softmax probability, or q of a sampled token) when it was
            given floors, which the controller fits to what the target accepts (decoding/confidence.py);
            None otherwise.
    """

    tokens: list[int]
    probs: Tensor | None = None
    parents: list[int] | None = None
    drafter: str = ""
    work: float | None = None
    confidences: list[float] | None = None

    @property
    def k(self) -> int:
        return len(self.tokens)

    def truncated(self, k: int) -> Draft:
        """The draft cut to its first k nodes (tokens, probs, parents and confidences alike; still a valid
        tree, since parents come before their children); itself when it has k or fewer."""
        if self.k <= k:
            return self
        return Draft(tokens=self.tokens[:k], probs=None if self.probs is None else self.probs[:k],
                     parents=None if self.parents is None else self.parents[:k], drafter=self.drafter,
                     work=self.work, confidences=None if self.confidences is None else self.confidences[:k])


@dataclass
class Verdict:
    """What the target decided about one draft.

    accepted: how many draft tokens were accepted (a prefix for chains, a root path for trees).
    path:     indices into draft.tokens of the accepted nodes (chain: 0..accepted-1).
    next_token: the token the target adds itself: the correction at the first miss, or the bonus
                token when every draft token was accepted.
    """

    accepted: int
    next_token: int
    path: list[int] = field(default_factory=list)

    def emitted(self, draft: Draft) -> list[int]:
        """Tokens this round adds to the output, in order."""
        return [draft.tokens[i] for i in self.path] + [self.next_token]
