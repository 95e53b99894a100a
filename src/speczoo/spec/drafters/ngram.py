"""Prompt-lookup drafting: propose the continuation of the most recent earlier occurrence of the
context's last m tokens, falling back from order m to shorter orders.

The index is a hash map per order n: (n-gram) -> the positions right after its occurrences; lookup
takes the most recent. It is updated incrementally as committed tokens arrive (each new token adds one entry per order), so a
round costs O(m + K) however long the history is. It never sees the target model.
"""

from __future__ import annotations

from speczoo.spec.drafters.base import Drafter
from speczoo.spec.types import Draft


class NgramIndex:
    """n-gram -> the positions right after each of its occurrences (ascending), for orders
    min_order..max_order. Prompt lookup reads the most recent one; the tree drafter (ngram_tree.py)
    reads several."""

    def __init__(self, max_order: int, min_order: int = 1):
        if min_order < 1 or max_order < min_order:
            raise ValueError(f"n-gram orders must satisfy 1 <= min_order <= max_order, "
                             f"got min={min_order} max={max_order}")
        self.max_order = max_order
        self.min_order = min_order
        self.tokens: list[int] = []
        self._maps: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(min_order, max_order + 1)}

    def extend(self, ids: list[int]) -> None:
        """Append committed tokens. Each new position p registers the n-grams ending at p-1."""
        toks = self.tokens
        for t in ids:
            p = len(toks)            # the new token's position: the continuation of n-grams ending at p-1
            for n, m in self._maps.items():
                if p >= n:
                    m.setdefault(tuple(toks[p - n:p]), []).append(p)
            toks.append(t)

    def follow(self, context: list[int]) -> None:
        """Catch up with a drafter's growing context (the engine passes all committed ids each round)."""
        seen = len(self.tokens)
        if seen > len(context):
            raise ValueError("context shrank: call reset() before starting a new sequence")
        self.extend(context[seen:])

    def matches(self, n: int) -> list[int]:
        """Positions right after the earlier occurrences of the last n tokens (ascending; [] if none)."""
        if len(self.tokens) < n:
            return []
        return self._maps[n].get(tuple(self.tokens[-n:]), [])

    def continuation(self, start: int, k: int) -> list[int]:
        """The k tokens from position `start` on. A copy that runs into the present continues through
        its own draft (a repeating pattern such as "ab ab ab" is drafted in full rather than cut at the
        end of the history)."""
        toks, end = self.tokens, len(self.tokens)
        out: list[int] = []
        for p in range(start, start + k):
            out.append(toks[p] if p < end else out[p - end])
        return out

    def lookup(self, k: int) -> list[int]:
        """k tokens that followed the latest earlier occurrence of the longest matching suffix."""
        for n in range(self.max_order, self.min_order - 1, -1):
            starts = self.matches(n)
            if starts:
                return self.continuation(starts[-1], k)
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
        self.index.follow(context)
        return Draft(tokens=self.index.lookup(k), drafter=self.name)

    def commit(self, accepted: int) -> None:
        """Nothing to undo: the index holds committed tokens only."""
