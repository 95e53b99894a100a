"""Rejection sampling, chain and tree: (draft, the target's distributions, a generator) -> Verdict.

Chains (Leviathan et al. 2023; Chen et al. 2023): draft token d[i] was drawn from the drafter's q_i;
accept it with probability min(1, p_i(d[i]) / q_i(d[i])); at the first rejection emit a token drawn from
the normalized residual max(0, p_i − q_i) and stop; if all K are accepted emit a bonus token drawn from
p_K. Each emitted token is then distributed exactly as the target's p given the tokens before it: the
output follows the target distribution, whatever the drafter proposes.

Trees (SpecInfer, Miao et al. 2024; recursive speculative decoding, Jeon et al. 2024): at the current
row the target distribution is p (row 0: after a0). The children c_1, c_2, ... of the current node are
tried in draft order. Child c_j was drawn from q_j (draft.probs row c_j: the drafter's distribution for
it given its path *and its earlier siblings*). Accept it with probability min(1, p(c_j) / q_j(c_j)),
then move to its row with that row's fresh p; on rejection replace p by the normalized residual
max(0, p − q_j) and try the next sibling. When every child is rejected, emit a draw from the last
residual (the correction); at a leaf, emit a draw from the leaf's row (the bonus). One accept-or-residual
step turns a draw from q_j plus a draw from norm(max(0, p − q_j)) into a draw from p (the chain rule);
by induction over the siblings each row emits a token distributed as p. Drafters must therefore report
the distribution each node was really drawn from: children sampled without replacement carry q with the
earlier siblings removed and renormalized; deterministic children (top-k picks, n-gram candidates)
carry no probs.

p:  the target's processed distribution at a row (speczoo.sampling.probs: temperature, top-k, top-p).
q:  the drafter's distribution a draft token was drawn from (Draft.probs); a draft without probs
    (prompt lookup, deterministic tree picks) counts as one-hot q on its token.
Rows as in decoding/verify/__init__.py. Never sees a model or a cache and never mutates its inputs;
randomness comes only from the generator.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from speczoo.sampling import sample
from speczoo.decoding.types import Draft, Verdict
from speczoo.decoding.verify.tree import TreeLayout


def verify_sampling(draft: Draft, target_probs: Tensor, generator: torch.Generator) -> Verdict:
    """Rejection-sampling verification of a chain draft.

    draft:        a chain of K tokens; draft.probs [K, V] the distribution each was drawn from, or None
                  (one-hot q).
    target_probs: [K + 1, V] the target's processed distribution (speczoo.sampling.probs) per row.
    generator:    the request's random generator (the only source of randomness).
    Only the rows the verdict needs are read in full (one residual or the bonus row), so the cost per
    round is O(K + V), not O(K·V).
    """
    k = draft.k
    _check_shapes(draft, target_probs)
    v = target_probs.shape[1]
    idx = torch.arange(k)
    tokens = torch.tensor(draft.tokens, dtype=torch.long)                  # [K]
    p_tok = target_probs[idx, tokens].double().tolist()                    # K values of p_i(d_i)
    q_tok = [1.0] * k if draft.probs is None else draft.probs[idx, tokens].double().tolist()
    u = torch.rand(k, generator=generator, dtype=torch.float64).tolist()   # K uniforms
    for i, tok in enumerate(draft.tokens):
        if not q_tok[i] > 0.0:
            raise ValueError(
                f"draft token {tok} at position {i} has q = {q_tok[i]} under the drafter's own probs; "
                f"draft.probs must be the distribution the token was sampled from")
        if u[i] * q_tok[i] < p_tok[i]:                                     # u < p/q, no division
            continue
        p = prob_row(target_probs, i)                                      # [V] float64
        if draft.probs is None:
            q = torch.zeros(v, dtype=torch.float64)                        # [V] one-hot on d_i
            q[tok] = 1.0
        else:
            q = prob_row(draft.probs, i, "draft.probs")                    # [V]
        residual = torch.clamp(p - q, min=0.0)                             # [V]
        if float(residual.sum()) <= 0.0:
            residual = p                                                   # p == q (rounding): p itself
        nxt = int(sample(residual[None], generator))
        return Verdict(accepted=i, next_token=nxt, path=list(range(i)))
    bonus = int(sample(prob_row(target_probs, k)[None], generator))
    return Verdict(accepted=k, next_token=bonus, path=list(range(k)))


def prob_row(probs: Tensor, i: int, what: str = "target probs") -> Tensor:
    """Row i as float64 [V], checked to sum to a positive finite number (NaN and inf show in the sum)."""
    row = probs[i].double()
    total = float(row.sum())
    if not (math.isfinite(total) and total > 0):
        raise ValueError(f"row {i} of {what} sums to {total}, not a distribution; "
                         f"pass speczoo.sampling.probs(...)")
    return row


def _check_shapes(draft: Draft, target_probs: Tensor) -> None:
    k = draft.k
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"verify_sampling needs target probs [K+1={k + 1}, V], "
                         f"got shape {tuple(target_probs.shape)}")
    v = target_probs.shape[1]
    if draft.parents is not None and draft.parents != list(range(-1, k - 1)):
        raise ValueError("verify_sampling handles chain drafts only; this draft is a token tree")
    for i, tok in enumerate(draft.tokens):
        if not 0 <= tok < v:
            raise ValueError(f"draft token {tok} at position {i} is outside the vocabulary (V={v})")
    if draft.probs is not None and (draft.probs.dim() != 2 or tuple(draft.probs.shape) != (k, v)):
        raise ValueError(f"draft.probs must be [K={k}, V={v}], got {tuple(draft.probs.shape)}")


def verify_tree_sampling(draft: Draft, layout: TreeLayout, target_probs: Tensor,
                         generator: torch.Generator) -> Verdict:
    """Rejection-sampling verification of a tree draft (recursive among siblings, module docstring).

    draft:        a token tree of N nodes; draft.probs [N, V] the distribution each node was drawn from,
                  or None (every node deterministic: one-hot q).
    layout:       its TreeLayout (N + 1 rows, row 0 = a0).
    target_probs: [N + 1, V] the target's processed distribution (speczoo.sampling.probs) per row.
    generator:    the request's random generator.
    A row is read in full only after a rejection at it, or for the final draw.
    """
    _check_tree(draft, layout, target_probs)
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


def _check_tree(draft: Draft, layout: TreeLayout, target_probs: Tensor) -> None:
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
