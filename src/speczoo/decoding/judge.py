"""The target's verdict on a planned round, from the logits of its verify forward, and the rollback of
the target cache to the accepted rows: the part of a round that the single engine (decoding/engine.py)
and the continuous batch (decoding/batch.py) share, so that both decide a sequence's tokens with the
same lines of code.

The caller runs the forward over [a0] + the plan's draft (a chain, or a token tree with its layout) in
whatever cache it owns and hands over that forward's logits [S, V] and hidden states; `conclude` then
verifies (greedy, or rejection sampling with the generation's own generator), keeps the accepted rows
in `cache` (anything with truncate(n) and compact(src, dst): a KVCache, one slot of a SlotCache) and
gives the drafters that read target features the committed rows. `first_token` is the same for the
prefill: the target's a0 from the prompt's last logits row.

Never runs a model and never chooses what to draft.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from speczoo import sampling
from speczoo.decoding.round import Generation, Plan
from speczoo.decoding.tree import TreeLayout, verify_tree_greedy
from speczoo.decoding.tree_sampling import verify_tree_sampling
from speczoo.decoding.types import Verdict
from speczoo.decoding.verify import verify_greedy
from speczoo.decoding.verify_sampling import verify_sampling


class Rollback(Protocol):
    """What `conclude` needs of a cache: positions count from the sequence's own start."""

    def truncate(self, n: int) -> None: ...

    def compact(self, src: list[int], dst: int) -> None: ...


def first_token(g: Generation, logits: Tensor) -> None:
    """The prefill's last logits row [1, V] chose a0 (argmax, or a draw from the request's generator)."""
    g.start(sampling.pick(logits, g.sampling, g.rng).tolist()[0])


def conclude(g: Generation, plan: Plan, logits: Tensor, hidden: list[Tensor], cache: Rollback, base: int,
             layout: TreeLayout | None = None) -> tuple[Verdict, int]:
    """The verdict on [a0] + plan.draft from its forward's logits [S, V] (S = K + 1, or the tree's N + 1
    rows of `layout`), the cache rolled back to `base` + a0 + the accepted tokens (a tree's accepted path
    moved next to the prefix first), and the committed rows' features handed to the drafters. Returns
    the verdict and how many draft tokens the target judged (a chain: all K; a tree: along its path)."""
    draft, params = plan.draft, g.sampling
    if layout is None:
        if params.greedy:
            verdict = verify_greedy(draft, logits.argmax(-1).tolist())
        else:
            verdict = verify_sampling(draft, sampling.probs(logits, params), g.rng)
        cache.truncate(base + 1 + verdict.accepted)
        g.taps.send(hidden, slice(0, 1 + verdict.accepted))
        return verdict, draft.k
    if params.greedy:
        verdict = verify_tree_greedy(draft, layout, logits.argmax(-1).tolist())
    else:
        verdict = verify_tree_sampling(draft, layout, sampling.probs(logits, params), g.rng)
    cache.compact([base + 1 + i for i in verdict.path], base + 1)
    cache.truncate(base + 1 + verdict.accepted)
    g.taps.send(hidden, torch.tensor([0] + [1 + i for i in verdict.path]))
    return verdict, layout.judged(verdict.path)
