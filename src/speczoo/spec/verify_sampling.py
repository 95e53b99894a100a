"""Pure speculative-sampling verification of a chain draft: (draft, target probs, generator) -> Verdict.

The rule (Leviathan et al. 2023; Chen et al. 2023): draft token d[i] was drawn from the drafter's q_i;
accept it with probability min(1, p_i(d[i]) / q_i(d[i])); at the first rejection emit a token drawn from
the normalized residual max(0, p_i − q_i) and stop; if all K are accepted emit a bonus token drawn from
p_K. Each emitted token is then distributed exactly as the target's p given the tokens before it: the
output follows the target distribution, whatever the drafter proposes.

Row convention as in spec/verify.py: target_probs row i is the target's distribution for the token after
d[i-1] (row 0: after a0), so d[i] is checked against row i, and the token the target adds itself comes
from row `accepted`. Drafts without probabilities (n-gram) count as one-hot q on the proposed token.

Never sees a model or a cache and never mutates its inputs; randomness comes only from the generator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speczoo.spec.types import Draft, Verdict


def verify_sampling(draft: Draft, target_probs: Tensor, generator: torch.Generator) -> Verdict:
    """Speculative-sampling chain verification.

    target_probs: [K + 1, V] the target's processed distribution (speczoo.sampling.probs) per row.
    draft.probs:  [K, V] the distribution each draft token was drawn from, or None (one-hot q).
    """
    k = draft.k
    p_all = _check_target(target_probs, k)                                 # [K+1, V] float64
    v = p_all.shape[1]
    q_all = _check_draft(draft, v)                                         # [K, V] float64 or None
    for i, tok in enumerate(draft.tokens):
        p = p_all[i]                                                       # [V]
        q_tok = 1.0 if q_all is None else float(q_all[i, tok])
        if q_tok <= 0.0:
            raise ValueError(
                f"draft token {tok} at position {i} has q = 0 under the drafter's own probs; "
                f"draft.probs must be the distribution the token was sampled from")
        p_tok = float(p[tok])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if u * q_tok < p_tok:                                              # u < p/q, no division
            continue
        q = _one_hot(tok, v) if q_all is None else q_all[i]                # [V]
        residual = torch.clamp(p - q, min=0.0)                             # [V]
        if float(residual.sum()) <= 0.0:
            residual = p                                                   # p == q (rounding): p itself
        nxt = int(torch.multinomial(residual, 1, generator=generator))
        return Verdict(accepted=i, next_token=nxt, path=list(range(i)))
    bonus = int(torch.multinomial(p_all[k], 1, generator=generator))
    return Verdict(accepted=k, next_token=bonus, path=list(range(k)))


def _one_hot(tok: int, v: int) -> Tensor:
    q = torch.zeros(v, dtype=torch.float64)                                # [V]
    q[tok] = 1.0
    return q


def _check_target(target_probs: Tensor, k: int) -> Tensor:
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"verify_sampling needs target probs [K+1={k + 1}, V], "
                         f"got shape {tuple(target_probs.shape)}")
    p = target_probs.double()
    if torch.isnan(p).any() or (p < 0).any():
        raise ValueError("target probs contain NaN or negative values; pass speczoo.sampling.probs(...)")
    if (p.sum(dim=-1) <= 0).any():
        raise ValueError("a row of target probs sums to 0; pass speczoo.sampling.probs(...)")
    return p


def _check_draft(draft: Draft, v: int) -> Tensor | None:
    if draft.parents is not None and draft.parents != list(range(-1, draft.k - 1)):
        raise ValueError("verify_sampling handles chain drafts only; this draft is a token tree")
    for i, tok in enumerate(draft.tokens):
        if not 0 <= tok < v:
            raise ValueError(f"draft token {tok} at position {i} is outside the vocabulary (V={v})")
    if draft.probs is None:
        return None
    if draft.probs.dim() != 2 or draft.probs.shape != (draft.k, v):
        raise ValueError(f"draft.probs must be [K={draft.k}, V={v}], got {tuple(draft.probs.shape)}")
    q = draft.probs.double()
    if torch.isnan(q).any() or (q < 0).any():
        raise ValueError("draft.probs contain NaN or negative values")
    return q
