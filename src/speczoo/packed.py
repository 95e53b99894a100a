"""Greedy decoding of several independent prompts at once: one target forward per step for all of them.

On a CPU a decode step is bound by reading the weights, so a forward over S rows costs far less than S
steps (c_v(9) ≈ 1.8 for the 1.5B here): decoding 8 prompts side by side writes ~4x the tokens per
second of one. That is what makes the target's own answers (the EAGLE head's chat data,
training/eagle/answers.py) affordable on this machine.

The prompts share one KV cache, each row seeing its own sequence only (explicit attention keys,
models/base.py `plan_keys`): prompt b's prefill fills slots [start_b, start_b + P_b), then each step
appends one slot per unfinished sequence, and a row attends to its prompt's range followed by its own
generated slots, in order. With the batch-invariant kernels a row's logits are the same bits as when
that prompt is decoded alone (the same key and value vectors in the same order, row-wise linears), so
every continuation is exactly plain greedy decoding's; tests/test_packed.py holds it to that. It never
uses speculation and owns the cache it builds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speczoo.cache import KVCache
from speczoo.kernels.attention import KeyRows


def greedy_packed(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  eos_ids: Sequence[int] = ()) -> list[list[int]]:
    """The greedy continuation of each prompt: up to `max_new_tokens` ids, stopping at the first end id
    (left out, as the engine reports a generation). All prompts decode together, one forward per step
    over the unfinished ones; the model must not have sliding-window layers."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if not prompts:
        return []
    ends = set(eos_ids)
    cache = KVCache(model.args, sum(len(p) for p in prompts) + len(prompts) * max_new_tokens, extra=0)
    starts: list[int] = []
    out: list[list[int]] = []
    with torch.no_grad():
        for p in prompts:                                      # prefill each in its own slot range
            s0, n = cache.length, len(p)
            keys = KeyRows.from_rows([(s0, s0 + i + 1) for i in range(n)])
            logits = model(torch.tensor(list(p)), torch.arange(n), cache, keys=keys,
                           logit_rows=slice(-1, None)).logits  # [1, V]
            starts.append(s0)
            out.append([int(logits[0].argmax())])
        own: list[list[int]] = [[] for _ in prompts]           # slots of each sequence's fed answer ids
        live = [b for b, o in enumerate(out) if not _done(o, ends, max_new_tokens)]
        while live:
            l0 = cache.length
            rows = [torch.tensor(own[b] + [l0 + j], dtype=torch.int64) for j, b in enumerate(live)]
            keys = KeyRows(lo=torch.tensor([starts[b] for b in live]),
                           hi=torch.tensor([starts[b] + len(prompts[b]) for b in live]),
                           off=torch.tensor([0] + [len(r) for r in rows]).cumsum(0),
                           idx=torch.cat(rows))
            tokens = torch.tensor([out[b][-1] for b in live])
            positions = torch.tensor([len(prompts[b]) + len(out[b]) - 1 for b in live])
            logits = model(tokens, positions, cache, keys=keys).logits   # [S, V]
            nxt = logits.argmax(-1).tolist()
            for j, b in enumerate(live):
                own[b].append(l0 + j)
                out[b].append(nxt[j])
            live = [b for b in live if not _done(out[b], ends, max_new_tokens)]
    return [o[:-1] if o[-1] in ends else o for o in out]


def _done(ids: list[int], ends: set[int], max_new_tokens: int) -> bool:
    return len(ids) >= max_new_tokens or ids[-1] in ends
