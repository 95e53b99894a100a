"""Suffix drafting (`--spec suffix`): the most frequent continuation of the context's longest matching
suffix, in this request's own ids and in the memory of earlier answers, as SuffixDecoding does.

Each round it finds the longest suffix of the context that occurred before, in two sources: the
request's own prompt and output (a prompt-lookup index, drafters/ngram.py) and its tenant's memory of
earlier answers as it stood when the request started (drafters/suffix_memory.py `Recall`). The match is
measured backwards up to Drafting.match_cap ids, and the occurrences that match longest (the most recent
Drafting.suffix_matches per source) vote: the draft follows, token by token, the continuation most of
them share (ties: the most recent), those that disagree drop out, and it stops
  * after suffix_spec_factor · match length tokens: a short match is drafted short;
  * where the continuation's empirical probability (the product of each chosen token's share of the
    occurrences still agreeing) falls below suffix_min_prob;
  * where every occurrence ran out (an answer's end), or at the controller's K.
Its `situation` is prompt lookup's ("<band>/<agree|mixed>": the match's length band, and whether the
voters agree on the next id), so the controller starts from the same priors and prices it, like prompt
lookup, at its measured cost per token (decoding/pricing/calibrate.py).

When the generation ends it hands its answer (with the prompt's last suffix_lead ids) to the memory, for
requests that start later. A request given no Recall (a seeded sampled one, whose samples must not
depend on what others asked before) drafts from its own ids alone. Never sees the target model; keeps
nothing per round that `commit` would have to undo.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.drafters.ngram import NgramIndex
from speczoo.decoding.drafters.suffix_memory import SEP, Recall
from speczoo.decoding.tuning import DRAFTING, Drafting
from speczoo.decoding.types import Draft


@dataclass(frozen=True, slots=True)
class _Voter:
    """One occurrence of the matched suffix: where its continuation starts, in the own ids or the memory."""

    start: int
    own: bool


@dataclass(frozen=True, slots=True)
class _Match:
    """The round's longest match: its length (backwards, capped) and the occurrences that match that long,
    most recent first."""

    length: int
    voters: tuple[_Voter, ...]


class SuffixDrafter(Drafter):
    name = "suffix"
    situation_priors = DRAFTING.situation_priors

    def __init__(self, recall: Recall | None, prompt_len: int, max_order: int = 3, drafting: Drafting = DRAFTING):
        self.recall = None if recall is None or recall.empty else recall
        self._remember = recall
        self.prompt_len = prompt_len
        self.max_order = max_order
        self.d = drafting
        self.own = NgramIndex(max_order)
        self._found: tuple[int, _Match | None] = (-1, None)     # (context length, its match)

    def reset(self) -> None:
        self.own = NgramIndex(self.max_order)
        self._found = (-1, None)

    def situation(self, context: list[int]) -> str | None:
        m = self._match(context)
        if m is None:
            return None
        n = m.length
        band = "1" if n <= 1 else "2-3" if n < 4 else "4-7" if n < 8 else "8+"
        firsts = {self._at(v, 0, []) for v in m.voters}
        return f"{band}/{'agree' if len(firsts) == 1 else 'mixed'}"

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        m = self._match(context)
        if m is None:
            return Draft(tokens=[], drafter=self.name)
        limit = min(k, max(1, math.ceil(self.d.suffix_spec_factor * m.length)))
        out: list[int] = []
        voters, prob = list(m.voters), 1.0
        while len(out) < limit and voters:
            votes: dict[int, list[_Voter]] = {}
            for v in voters:                     # most recent first: a tie goes to the most recent
                t = self._at(v, len(out), out)
                if t != SEP:
                    votes.setdefault(t, []).append(v)
            if not votes:
                break
            token, agreeing = max(votes.items(), key=lambda kv: len(kv[1]))
            prob *= len(agreeing) / len(voters)
            if prob < self.d.suffix_min_prob:
                break
            out.append(token)
            voters = agreeing
        return Draft(tokens=out, drafter=self.name)

    def commit(self, accepted: int) -> None:
        """Nothing to undo: the index holds committed ids only, and the memory changes only at the end."""

    def finish(self, context: list[int]) -> None:
        """Remember the answer (after the prompt's last suffix_lead ids) for requests that start later."""
        if self._remember is not None and len(context) > self.prompt_len:
            self._remember.remember(context[max(0, self.prompt_len - self.d.suffix_lead):])

    # -- the match ----------------------------------------------------------------------------
    def _match(self, context: list[int]) -> _Match | None:
        """The longest match of the context's suffix over both sources (remembered per context length:
        a round asks twice, situation then propose)."""
        if self._found[0] == len(context):
            return self._found[1]
        self.own.follow(context)
        cap, w = self.d.match_cap, self.d.suffix_matches
        tail = context[-cap:]
        scored = [(self.own.match_length(p, cap), _Voter(p, True)) for p in reversed(self.own.longest()[-w:])]
        if self.recall is not None:
            scored += [(self._memory_match(p, tail), _Voter(p, False)) for p in reversed(self._recalled(context))]
        best = max((n for n, _ in scored), default=0)
        m = _Match(best, tuple(v for n, v in scored if n == best)) if best > 0 else None
        self._found = (len(context), m)
        return m

    def _recalled(self, context: list[int]) -> list[int]:
        """The memory's most recent occurrences of the longest suffix order it holds ([] if none)."""
        lo, hi = self.d.suffix_orders
        for n in range(min(hi, len(context)), lo - 1, -1):
            starts = self.recall.occurrences(tuple(context[-n:]), self.d.suffix_matches)
            if starts:
                return starts
        return []

    def _memory_match(self, start: int, tail: list[int]) -> int:
        """How many ids before memory position `start` equal the last ids of `tail` (stops at an answer's
        start)."""
        n, at = 0, self.recall.token
        while n < len(tail) and (t := at(start - 1 - n)) != SEP and t == tail[-1 - n]:
            n += 1
        return n

    def _at(self, v: _Voter, i: int, drafted: list[int]) -> int:
        """The i-th id of voter v's continuation (an own one that runs into the present continues
        through the draft itself, as prompt lookup's does)."""
        p = v.start + i
        if not v.own:
            return self.recall.token(p)
        toks = self.own.tokens
        return toks[p] if p < len(toks) else drafted[p - len(toks)]
