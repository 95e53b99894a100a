"""OpenAI's presence and frequency penalties, per verify row, so that speculation stays lossless.

OpenAI defines them on the tokens generated so far: logit[t] -= presence * (count[t] > 0) + frequency *
count[t]. Plain decoding applies that before each pick. A verify forward's row r predicts the token
after a0 and the draft's first r tokens, so its penalty counts the output, a0 and those r draft tokens
(`row_penalties`), and the verdict then picks (or draws) exactly as plain decoding with penalties would.
Rounds with penalties verify chains: a tree draft falls back to its first path, as under a grammar
(decoding/constraint.py `first_path`).

Pure: a function of the ids and the request's parameters; never sees a model, a cache or a drafter.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speczoo.request import SamplingParams


def row_penalties(generated: list[int], draft: list[int], params: SamplingParams, v: int) -> Tensor:
    """[K + 1, V] what to subtract from each verify row's logits.

    generated: the ids generated before row 0's prediction (the output and a0); draft: the K draft tokens.
    """
    k = len(draft)
    counts = torch.bincount(torch.tensor(generated, dtype=torch.long), minlength=v).float()   # [V]
    rows = counts.expand(k + 1, v).clone()                                                   # [K+1, V]
    if k:
        step = torch.zeros(k + 1, v)                                                         # [K+1, V]
        step[torch.arange(1, k + 1), torch.tensor(draft, dtype=torch.long)] = 1.0
        rows += step.cumsum(0)                       # row r also counts draft tokens 0..r-1
    return params.presence_penalty * (rows > 0).float() + params.frequency_penalty * rows
