"""The head's reduced draft vocabulary: the target tokens it may propose.

EAGLE-3 (and FR-Spec) keep the LM head small by proposing only the most frequent target tokens; a
token outside the draft vocabulary is simply never proposed (the target still emits it). The
frequencies come from what the target itself predicts on the training corpus. Pure functions over
count tensors; nothing here reads a model.
"""

from __future__ import annotations

import torch
from torch import Tensor


def draft_vocab(counts: Tensor, size: int, always: list[int] | tuple[int, ...] = ()) -> Tensor:
    """The `size` most frequent target ids by `counts` [V] (ties: lower id first), plus `always` (e.g.
    the end-of-sequence ids) at the expense of the rarest. Returns ascending target ids [size].
    """
    v = counts.numel()
    if not 0 < size <= v:
        raise ValueError(f"draft vocabulary size must be in 1..{v}, got {size}")
    always = sorted(set(int(i) for i in always))
    if len(always) > size or any(not 0 <= i < v for i in always):
        raise ValueError(f"always-included ids {always} do not fit a draft vocabulary of {size} over {v} ids")
    score = counts.double().clone()
    score[always] = float("inf")
    # stable sort on -score keeps ascending ids among equal counts
    order = torch.sort(-score, stable=True).indices[:size]
    return order.sort().values


def t2d_index(draft_to_target: Tensor, target_vocab: int) -> Tensor:
    """[V] int64: the draft id of each target id, -100 for ids outside the draft vocabulary."""
    idx = torch.full((target_vocab,), -100, dtype=torch.long)
    idx[draft_to_target.long()] = torch.arange(draft_to_target.numel())
    return idx
