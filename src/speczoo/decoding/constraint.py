"""Grammar-constrained decoding under speculation: one round's per-row masks, from one generation's
grammar state.

A constrained generation carries a `Grammar` (built per request by the engine's grammar factory:
speczoo/grammar.py, over llguidance), always advanced through the committed output and the pending
token a0. `constrain` walks a round's draft through it: row r of the verify forward gets the mask of
the state after a0 and draft tokens 0..r-1, and the first draft token the grammar forbids ends the
draft. The verify functions take the masks as an input beside the logits (verify/judge.py) and choose
among allowed tokens only, so the output equals constrained plain decoding token for token (greedy:
the masked argmax; sampled: a draw from the masked distribution). After the verdict the round rolls
the grammar back to the accepted length and advances it by the target's own token (round.py, `settle`).

A forbidden draft token is cut before it is verified: under greedy verification, and for drafts
without probs (one-hot q: prompt lookup, deterministic picks), it would be rejected for sure, with the
same correction. A draft drawn from a distribution q (Draft.probs: a draft model's sampled draft)
keeps that token as its last one instead: it is rejected for sure (p = 0 under the mask) and the
correction is drawn from the residual max(0, p - q), as rejection sampling needs to stay exact (cutting
it would draw from p and bias the output). The row after it is never read; it gets an all-allowed mask.

Token trees: a constrained round verifies a chain. A tree draft falls back to its first root-to-leaf
path (each node's first child, in draft order), a valid chain draft: its nodes carry no probs, or the
first child's q is the drafter's plain distribution (`first_path`).

Pure of models and caches: it reads and advances only the grammar it is handed, never mutates a draft.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from speczoo.request import Constraint
from speczoo.decoding.types import Draft
from speczoo.decoding.verify.tree import is_chain


class Grammar(Protocol):
    """One generation's grammar state, after every token consumed so far."""

    def allowed(self) -> Tensor:
        """[V] bool: the tokens the grammar allows next (the end ids exactly when the text may end)."""
        ...

    def consume(self, token: int) -> None:
        """Advance by one allowed token (ValueError for a forbidden one)."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last n consumed tokens."""
        ...


# A request's constraint -> a fresh grammar state for its generation (ValueError: the grammar is invalid)
GrammarFactory = Callable[[Constraint], Grammar]


@dataclass(frozen=True, slots=True)
class Constrained:
    """A round's draft inside the grammar.

    draft:    the chain to verify after a0 (the proposal, cut at the first forbidden token).
    masks:    [K + 1, V] bool: row r's allowed tokens (row 0: after a0).
    consumed: the draft tokens the grammar advanced through (what the round rolls back past the accepted).
    """

    draft: Draft
    masks: Tensor
    consumed: int


def constrain(grammar: Grammar, draft: Draft) -> Constrained:
    """The round's masks, and its draft cut where the grammar forbids a token (module docstring); the
    grammar ends advanced through `consumed` draft tokens."""
    if not is_chain(draft.parents):
        draft = first_path(draft)
    masks = [grammar.allowed()]                                   # K' + 1 rows of [V]
    kept = draft.k
    for i, tok in enumerate(draft.tokens):
        if not bool(masks[-1][tok]):
            kept = i
            break
        grammar.consume(tok)
        masks.append(grammar.allowed())
    consumed = len(masks) - 1
    if kept < draft.k and draft.probs is not None:                # keep it: rejected for sure, exact residual
        masks.append(torch.ones_like(masks[0]))
        kept += 1
    return Constrained(draft.truncated(kept), torch.stack(masks), consumed)


def first_path(draft: Draft) -> Draft:
    """A token tree's first root-to-leaf path (each node's first child in draft order) as a chain draft."""
    path: list[int] = []
    node = -1
    for i, parent in enumerate(draft.parents or []):
        if parent == node:
            path.append(i)
            node = i
    return Draft(tokens=[draft.tokens[i] for i in path], probs=None if draft.probs is None else draft.probs[path],
                 drafter=draft.drafter, work=draft.work)
