"""Log-probabilities of emitted tokens, read off the verified logits rows that chose them.

A token's log-probability is log_softmax of the row of the target's forward that predicted it (the
prefill's last row for the first token; a verify forward's row for every later one), under the
target's raw distribution: before temperature, top-k and top-p, as vLLM reports by default. Each row is
reduced on its own, so on the batch-invariant kernels (a row's logits are the same bits whatever the
forward's other rows) a token gets the same float through speculation or plain decoding, alone or in a
batch. Computed only for requests that ask (GenerationRequest.logprobs); pure: never sees a model or a cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speczoo.events import TokenLogprob

MAX_TOP = 20        # the most alternatives a row reports (OpenAI's top_logprobs limit)


def row_logprobs(logits: Tensor, rows: slice | Tensor, chosen: list[int], top: int) -> list[TokenLogprob]:
    """The TokenLogprob of `chosen[i]` under row `rows[i]` of `logits`, with the row's `top` most likely ids.

    logits: [S, V] a forward's logits; rows: which of its rows, in the order of `chosen` (a slice or a
    1-D index tensor); top: alternatives per row, 0..MAX_TOP.
    """
    if not 0 <= top <= MAX_TOP:
        raise ValueError(f"top logprobs must be in 0..{MAX_TOP}, got {top}")
    picked = logits[rows]                                        # [n, V]
    if picked.shape[0] != len(chosen):
        raise ValueError(f"{picked.shape[0]} logits rows for {len(chosen)} chosen tokens")
    out = []
    for row, token in zip(picked, chosen):
        lp = torch.log_softmax(row.float(), dim=-1)              # [V], one row at a time: batch-invariant
        alts: tuple[tuple[int, float], ...] = ()
        if top:
            values, ids = torch.topk(lp, top)                   # [top], most likely first
            alts = tuple(zip(ids.tolist(), values.tolist()))
        out.append(TokenLogprob(token, lp[token].item(), alts))
    return out
