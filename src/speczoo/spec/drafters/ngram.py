"""Prompt-lookup drafting: propose the continuation of the most recent earlier occurrence of the
context's last m tokens, falling back from order m to shorter orders.

The index is a hash map per order n: (n-gram) -> the position right after its most recent occurrence.
It is updated incrementally as committed tokens arrive (each new token adds one entry per order), so a
round costs O(m + K) however long the history is. It never sees the target model.
"""

from __future__ import annotations

from speczoo.spec.drafters.base import Drafter
from speczoo.spec.types import Draft


class NgramIndex:
    """n-gram -> position after its most recent occurrence, for orders 1..max_order."""

    def __init__(self, max_order: int, min_order: int = 1):
        if min_order < 1 or max_order < min_order:
            raise ValueError(f"n-gram orders must satisfy 1 <= min_order <= max_order, "
                             f"got min={min_order} max={max_order}")
        self.max_order = max_order
        self.min_order = min_order
        self.tokens: list[int] = []
        self._maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_order, max_order + 1)}

    def extend(self, ids: list[int]) -> None:
        """Append committed tokens. Each new position p registers the n-grams ending at p-1."""
        toks = self.tokens
        for t in ids:
            p = len(toks)            # the new token's position: the continuation of n-grams ending at p-1
            for n, m in self._maps.items():
                if p >= n:
                    m[tuple(toks[p - n:p])] = p
            toks.append(t)

    def lookup(self, k: int) -> list[int]:
        """k tokens that followed the latest earlier occurrence of the longest matching suffix.

        A copy that runs into the present continues through its own draft (a repeating pattern such
        as "ab ab ab" is drafted in full rather than cut at the end of the history).
        """
        toks = self.tokens
        end = len(toks)
        for n in range(self.max_order, self.min_order - 1, -1):
            if end < n:
                continue
            start = self._maps[n].get(tuple(toks[-n:]))
            if start is not None:
                draft: list[int] = []
                for p in range(start, start + k):
                    draft.append(toks[p] if p < end else draft[p - end])
                return draft
        return []


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, max_order: int = 3, min_order: int = 1):
        self.max_order = max_order
        self.min_order = min_order
        self.index = NgramIndex(max_order, min_order)

    def reset(self) -> None:
        self.index = NgramIndex(self.max_order, self.min_order)

    def propose(self, context: list[int], k: int) -> Draft:
        seen = len(self.index.tokens)
        if seen > len(context):
            raise ValueError("context shrank: call reset() before starting a new sequence")
        self.index.extend(context[seen:])
        return Draft(tokens=self.index.lookup(k), drafter=self.name)

    def commit(self, accepted: int) -> None:
        """Nothing to undo: the index holds committed tokens only."""
