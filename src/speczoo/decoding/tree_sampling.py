"""Lossless speculative sampling over a token tree: recursive rejection sampling among siblings.

The multi-candidate rule (SpecInfer, Miao et al. 2024; recursive speculative decoding, Jeon et al. 2024):
at the current row the target distribution is p (row 0: after a0). The children c_1, c_2, ... of the
current node are tried in draft order. Child c_j was drawn from q_j (draft.probs row c_j: the drafter's
distribution for it given its path *and its earlier siblings*; one-hot on its token when the draft has
no probs, as for n-gram trees). Accept it with probability min(1, p(c_j) / q_j(c_j)), then move to its
row with that row's fresh p; on rejection replace p by the normalized residual max(0, p − q_j) and try
the next sibling. When every child is rejected, emit a draw from the last residual (the correction);
at a leaf, emit a draw from the leaf's row (the bonus).

Why it is lossless: one accept-or-residual step turns a draw from q_j plus a draw from norm(max(0, p − q_j))
into a draw from p (the chain rule of verify_sampling.py); by induction over the siblings, each row emits
a token distributed as p, whatever the drafter proposed. Drafters must therefore report the distribution
each node was really drawn from: children sampled without replacement carry q with the earlier siblings
removed and renormalized; deterministic children (top-k picks, n-gram candidates) carry no probs.

Row convention as in decoding/tree.py. Never sees a model or a cache and never mutates its inputs;
randomness comes only from the generator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speczoo.sampling import sample
from speczoo.decoding.tree import TreeLayout
from speczoo.decoding.types import Draft, Verdict
from speczoo.decoding.verify_sampling import prob_row


def verify_tree_sampling(draft: Draft, layout: TreeLayout, target_probs: Tensor,
                         generator: torch.Generator) -> Verdict:
    """Speculative-sampling verification of a tree draft.

    target_probs: [N + 1, V] the target's processed distribution (speczoo.sampling.probs) per row.
    draft.probs:  [N, V] the distribution each node was drawn from (see the module docstring), or None
                  (every node deterministic: one-hot q).
    A row is read in full only after a rejection at it, or for the final draw.
    """
    _check(draft, layout, target_probs)
    v = target_probs.shape[1]
    path: list[int] = []
    row = 0
    while True:
        p: Tensor | None = None                          # [V] float64 once a sibling was rejected here
        for c in layout.children[row]:
            tok = draft.tokens[c]
            q_tok = 1.0 if draft.probs is None else float(draft.probs[c, tok])
            if not q_tok > 0.0:
                raise ValueError(f"draft token {tok} at node {c} has q = {q_tok} under the drafter's own probs; "
                                 f"draft.probs must be the distribution the token was drawn from")
            p_tok = float(target_probs[row, tok]) if p is None else float(p[tok])
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u * q_tok < p_tok:                        # u < p/q, no division
                path.append(c)
                row = c + 1
                break
            if p is None:
                p = prob_row(target_probs, row)
            if draft.probs is None:
                q = torch.zeros(v, dtype=torch.float64)  # [V] one-hot on the rejected token
                q[tok] = 1.0
            else:
                q = draft.probs[c].double()              # [V]
            residual = torch.clamp(p - q, min=0.0)       # [V]
            total = float(residual.sum())
            if total > 0.0:                              # 0 only when p == q up to rounding: keep p
                p = residual / total
        else:
            final = prob_row(target_probs, row) if p is None else p
            nxt = int(sample(final[None], generator))
            return Verdict(accepted=len(path), next_token=nxt, path=path)


def _check(draft: Draft, layout: TreeLayout, target_probs: Tensor) -> None:
    n = draft.k
    if target_probs.dim() != 2 or target_probs.shape[0] != n + 1 or len(layout.children) != n + 1:
        raise ValueError(f"verify_tree_sampling needs target probs [N+1={n + 1}, V] and a layout of N+1 rows, "
                         f"got probs {tuple(target_probs.shape)} and {len(layout.children)} rows")
    v = target_probs.shape[1]
    for i, tok in enumerate(draft.tokens):
        if not 0 <= tok < v:
            raise ValueError(f"draft token {tok} at node {i} is outside the vocabulary (V={v})")
    if draft.probs is not None and (draft.probs.dim() != 2 or tuple(draft.probs.shape) != (n, v)):
        raise ValueError(f"draft.probs must be [N={n}, V={v}], got {tuple(draft.probs.shape)}")
