"""Prompt-lookup drafting: propose the continuation of an earlier occurrence of the context's last m
tokens, falling back from order m to shorter orders; of the suffix's recent occurrences, the one whose
match reaches furthest back (ties: the most recent), so that a passage copied line by line (a grep's
lines, a JSON object's fields, a function's lines that end alike) is followed to its own next line.

The index is a hash map per order n: (n-gram) -> the positions right after its occurrences; lookup
compares the Drafting.agree_window most recent (`pick`). It is updated incrementally as committed tokens
arrive (each new token adds one entry per order), so a round costs O(m + window × reach + K) however long
the history is. It never sees the target model.

Before the controller chooses, the drafter names its `situation`: the match's length (extended
backwards) and whether the suffix's recent occurrences agree on the next token. How often a first draft
token is accepted differs by an order of magnitude between the situations (docs/tuning.md,
`situation_priors`), so the controller keeps a separate estimate for each, starting from its prior.
"""

from __future__ import annotations

from collections.abc import Sequence

from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.tuning import DRAFTING
from speczoo.decoding.types import Draft


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
        self._longest: tuple[int, list[int]] = (-1, [])     # (history length, longest()) last computed
        self._chosen: tuple[int, int] = (-1, -1)             # (history length, chosen()) last computed

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

    def longest(self) -> list[int]:
        """The occurrences (`matches`) of the longest suffix order that has any; [] when none has.
        Remembered until the history grows (a round asks for it twice: situation, then lookup)."""
        if self._longest[0] == len(self.tokens):
            return self._longest[1]
        starts = self.occurrences(self.tokens[-self.max_order:])
        self._longest = (len(self.tokens), starts)
        return starts

    def occurrences(self, tail: list[int]) -> list[int]:
        """Positions right after the earlier occurrences of the longest suffix of `tail` (ids that may run
        past the history, such as a draft's own tokens) that occurs in the history; [] when none does."""
        for n in range(min(self.max_order, len(tail)), self.min_order - 1, -1):
            starts = self._maps[n].get(tuple(tail[len(tail) - n:]), [])
            if starts:
                return starts
        return []

    def chosen(self) -> int:
        """The occurrence of the longest matching suffix to copy (-1: none): of its Drafting.agree_window
        most recent occurrences, the one whose match reaches furthest back (up to Drafting.lookup_reach
        ids), the most recent of those that tie. Remembered until the history grows."""
        if self._chosen[0] != len(self.tokens):
            self._chosen = (len(self.tokens), self.pick(self.longest(), self.tokens))
        return self._chosen[1]

    def pick(self, starts: list[int], present: list[int]) -> int:
        """Of the most recent `starts` (Drafting.agree_window of them), the one whose earlier ids match the
        end of `present` furthest back (up to Drafting.lookup_reach); ties: the most recent; -1 if none.
        Text that repeats a line or a record (a grep's lines, a JSON object's fields) has many occurrences
        of a short suffix; the one that continues the passage being copied is the one matching longest."""
        best = self.ranked(starts, present)
        return best[0] if best else -1

    def ranked(self, starts: list[int], present: list[int] | None = None) -> list[int]:
        """The most recent `starts` (Drafting.agree_window of them), best first as `pick` chooses: the match
        with `present` (default: the history) reaching furthest back, then the most recent."""
        recent = starts[-DRAFTING.agree_window:]
        return sorted(recent, key=lambda s: (self.match_length(s, DRAFTING.lookup_reach, present), s), reverse=True)

    def lookup(self, k: int) -> list[int]:
        """k tokens that followed the chosen earlier occurrence of the longest matching suffix (`chosen`)."""
        start = self.chosen()
        return self.continuation(start, k) if start >= 0 else []

    def match_length(self, start: int, cap: int = DRAFTING.match_cap, present: list[int] | None = None) -> int:
        """How many tokens before `start` equal the last tokens of `present` (default: the history), up to
        `cap`: the match of the occurrence at `start`, extended backwards past the index's largest order."""
        toks, now, n = self.tokens, self.tokens if present is None else present, 0
        while n < min(cap, len(now)) and start - 1 - n >= 0 and toks[start - 1 - n] == now[len(now) - 1 - n]:
            n += 1
        return n

    def situation(self) -> str | None:
        """How promising `lookup` is now: "<band>/<agree|mixed>" from the latest occurrence's match length
        (bands 1, 2-3, 4-7, 8+) and whether the recent occurrences of the suffix all continue with the
        same token; None when there is no match."""
        starts = self.longest()
        return self._label(starts, self.chosen(), self.tokens[-DRAFTING.match_cap:]) if starts else None

    def branches(self) -> bool:
        """Whether the recent occurrences of the longest matching suffix (Drafting.agree_window of them)
        continue with different tokens: a "mixed" situation, where a tree's candidates part."""
        return len(self._nexts(self.longest())) > 1

    def ahead(self, drafted: list[int], k: int) -> tuple[str | None, list[int]]:
        """Prompt lookup past the history: the situation and the k ids that follow the history continued
        by `drafted` (ids not committed, such as a draft's own); (None, []) when nothing matches."""
        cap = max(DRAFTING.match_cap, DRAFTING.lookup_reach)
        present = (self.tokens[-cap:] + drafted)[-cap:]
        starts = self.occurrences(present[-self.max_order:])
        if not starts:
            return None, []
        start = self.pick(starts, present)
        return self._label(starts, start, present), self.continuation(start, k)

    def _label(self, starts: list[int], start: int, present: list[int]) -> str:
        n = self.match_length(start, present=present)
        band = "1" if n <= 1 else "2-3" if n < 4 else "4-7" if n < 8 else "8+"
        return f"{band}/{'agree' if len(self._nexts(starts)) == 1 else 'mixed'}"

    def _nexts(self, starts: list[int]) -> set[int]:
        """The tokens that followed the Drafting.agree_window most recent of the occurrences `starts`."""
        return {self.tokens[s] for s in starts[-DRAFTING.agree_window:]}   # indexed when its next token arrived


class PromptLookup(Drafter):
    """What the chain and tree prompt-lookup drafters share: one NgramIndex over the committed ids,
    its situation, and nothing to undo after a round (the index holds committed tokens only)."""

    situation_priors = DRAFTING.situation_priors

    def __init__(self, max_order: int = 3, min_order: int = 1):
        self.max_order = max_order
        self.min_order = min_order
        self.index = NgramIndex(max_order, min_order)

    def reset(self) -> None:
        self.index = NgramIndex(self.max_order, self.min_order)

    def situation(self, context: list[int]) -> str | None:
        """The prompt-lookup situation of the index (see NgramIndex.situation); None: no match."""
        self.index.follow(context)
        return self.index.situation()

    def commit(self, accepted: int) -> None:
        """Nothing to undo: the index holds committed tokens only."""


class NgramDrafter(PromptLookup):
    name = "ngram"

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        self.index.follow(context)
        return Draft(tokens=self.index.lookup(k), drafter=self.name)
