"""Pure speculative-sampling verification of a chain draft: (draft, target probs, generator) -> Verdict.

The rule (Leviathan et al. 2023; Chen et al. 2023): draft token d[i] was drawn from the drafter's q_i;
accept it with probability min(1, p_i(d[i]) / q_i(d[i])); at the first rejection emit a token drawn from
the normalized residual max(0, p_i − q_i) and stop; if all K are accepted emit a bonus token drawn from
p_K. Each emitted token is then distributed exactly as the target's p given the tokens before it: the
output follows the target distribution, whatever the drafter proposes.

Row convention as in decoding/verify.py: target_probs row i is the target's distribution for the token after
d[i-1] (row 0: after a0), so d[i] is checked against row i, and the token the target adds itself comes
from row `accepted`. Drafts without probabilities (n-gram) count as one-hot q on the proposed token.

Never sees a model or a cache and never mutates its inputs; randomness comes only from the generator.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from speczoo.sampling import sample
from speczoo.decoding.types import Draft, Verdict


def verify_sampling(draft: Draft, target_probs: Tensor, generator: torch.Generator) -> Verdict:
    """Speculative-sampling chain verification.

    target_probs: [K + 1, V] the target's processed distribution (speczoo.sampling.probs) per row.
    draft.probs:  [K, V] the distribution each draft token was drawn from, or None (one-hot q).
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
