"""Logits -> next-token distribution under SamplingParams (temperature, top-k, top-p), and sampling.

Speculative sampling is lossless with respect to the distribution `probs` returns, so the engine must
apply the SAME transform (same SamplingParams) to the target's and the drafter's logits: the output then
follows the processed target distribution exactly, and the closer q is to p the more drafts survive.

Order of the transform (as in transformers and vLLM): temperature, then top-k, then top-p. Temperature
0 means greedy: `probs` returns a one-hot row at the argmax (first index on ties), so sampling
verification with greedy params reduces to greedy verification.

Pure functions of their inputs: no models, no global random state (every draw takes an explicit
torch.Generator), never mutates the logits passed in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speczoo.request import SamplingParams


def validate(params: SamplingParams) -> None:
    """Raise ValueError with a clear message if the parameters are out of range."""
    if not isinstance(params.top_k, int) or isinstance(params.top_k, bool):
        raise ValueError(f"top_k must be an integer (0 = off), got {params.top_k!r}")
    params.validate()


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator: seeded for reproducible sampling, or from fresh entropy when seed is None."""
    gen = torch.Generator(device="cpu")
    if seed is None:
        gen.seed()
    else:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        gen.manual_seed(int(seed))
    return gen


def greedy(logits: Tensor) -> Tensor:
    """logits [S, V] -> ids [S] (argmax; the first index wins a tie)."""
    _check_logits(logits)
    return logits.argmax(dim=-1)


def probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [S, V] -> probabilities [S, V] (float32, rows sum to 1) after temperature, top-k, top-p."""
    validate(params)
    _check_logits(logits)
    s, v = logits.shape
    if params.greedy:
        out = torch.zeros(s, v, dtype=torch.float32)                      # [S, V]
        out[torch.arange(s), logits.argmax(dim=-1)] = 1.0
        return out
    # Shift by the row max (softmax does not change) and divide in float64: a tiny temperature
    # (1e-300, which float32 rounds to 0) then sends the other logits to -inf (probability 0)
    # instead of overflowing to inf or dividing 0 by 0 (NaN).
    x = logits.double()                                                   # [S, V]
    x = ((x - x.max(dim=-1, keepdim=True).values) / params.temperature).float()   # [S, V]
    if 0 < params.top_k < v:
        kth = torch.topk(x, params.top_k, dim=-1).values[:, -1:]          # [S, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    p = torch.softmax(x, dim=-1)                                          # [S, V]
    if params.top_p < 1.0:
        p = _top_p(p, params.top_p)
    return p


def sample(p: Tensor, generator: torch.Generator) -> Tensor:
    """probabilities [S, V] (rows need not be normalized) -> ids [S], one independent draw per row.

    Inverse-CDF in float64: a cumulative sum and a binary search per row, O(V); torch.multinomial
    takes milliseconds per row at V = 152k on this CPU. A token of probability 0 is never drawn.
    """
    if p.dim() != 2:
        raise ValueError(f"sample expects probabilities [S, V], got shape {tuple(p.shape)}")
    cdf = torch.cumsum(p.double(), dim=-1)                                # [S, V]
    total = cdf[:, -1:]                                                   # [S, 1]
    if not bool(torch.isfinite(total).all()) or bool((total <= 0).any()):
        raise ValueError("cannot sample: a row of probabilities sums to 0, inf or NaN")
    u = torch.rand(p.shape[0], 1, generator=generator, dtype=torch.float64)   # [S, 1]
    ids = torch.searchsorted(cdf, u * total, right=True)                  # [S, 1]
    return ids.clamp_(max=p.shape[1] - 1).squeeze(-1)                     # [S]


def pick(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> Tensor:
    """logits [S, V] -> ids [S]: argmax when greedy, else a draw from `probs` (needs a generator)."""
    if params.greedy:
        validate(params)
        return greedy(logits)
    if generator is None:
        raise ValueError("sampling with temperature > 0 needs a torch.Generator; "
                         "build one with speczoo.sampling.make_generator(seed)")
    return sample(probs(logits, params), generator)


def masked(logits: Tensor, allowed: Tensor) -> Tensor:
    """logits [S, V] with every token that `allowed` [S, V] (bool: a grammar's masks) forbids at -inf,
    as a new tensor: greedy then picks, and `probs` draws, among the allowed tokens only."""
    return logits.masked_fill(~allowed, float("-inf"))


def _top_p(p: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one); renormalize.

    p: [S, V] rows summing to 1.
    """
    sorted_p, order = torch.sort(p, dim=-1, descending=True, stable=True)  # [S, V] each
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p                       # [S, V]
    drop_sorted = mass_before >= top_p                                     # [S, V]
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)   # [S, V]
    kept = p.masked_fill(drop, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _check_logits(logits: Tensor) -> None:
    if logits.dim() != 2:
        raise ValueError(f"expected logits [S, V], got shape {tuple(logits.shape)}")
    if logits.shape[1] == 0:
        raise ValueError("logits have an empty vocabulary dimension (V = 0)")
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN; the model produced invalid output")
    if torch.isposinf(logits).any():
        raise ValueError("logits contain +inf; the model produced invalid output")
    if torch.isneginf(logits).all(dim=-1).any():
        raise ValueError("a row of logits is entirely -inf: no token is possible")
