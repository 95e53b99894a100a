"""Greedy decoding of several independent prompts at once: one target forward per step for all of them.

On a CPU a decode step is bound by reading the weights, so a forward over S rows costs far less than S
steps (c_v(S), docs/results.md): decoding several prompts side by side writes several times the tokens
per second of one. That is what makes the target's own answers (the EAGLE head's chat data,
training/eagle/answers.py) affordable on a CPU. (Not to be confused with kernels/pack.py, which packs
weights.)

The prompts share one KV cache, one slot each (speczoo/slots.py, the batched server's cache too):
each prompt is prefilled into its own slot, then each step feeds one token per unfinished sequence, all
in one forward, every row attending to its own sequence only. With the batch-invariant kernels a row's
logits are the same bits as when that prompt is decoded alone, so every continuation is exactly plain
greedy decoding's; tests/test_greedy_many.py holds it to that. It never uses speculation and owns the cache
it builds; a model with sliding-window layers is refused (SlotCache).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speczoo.context import DEFAULT_KV_TYPE, kv_dtype
from speczoo.models.forward import LAST_ROW
from speczoo.slots import Feed, SlotCache, forward_batch


def greedy_many(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                eos_ids: Sequence[int] = (), kv_type: str = DEFAULT_KV_TYPE) -> list[list[int]]:
    """The greedy continuation of each prompt: up to `max_new_tokens` ids, stopping at the first end id
    (left out, as the engine reports a generation). All prompts decode together, one forward per step
    over the unfinished ones.

    model:   a decoder with the batched forward contract (speczoo/slots.py forward_batch) and no
             sliding-window layers; prompts: the token ids of each prompt (at least one each);
    eos_ids: the ids that end a sequence; kv_type: the KV cache's element type, the runtime's (the same
    stored K/V values are what make the continuations plain greedy's). Returns one list of new ids per
    prompt, in order.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if not prompts:
        return []
    ends = set(eos_ids)
    cache = SlotCache(model.args, len(prompts), max(len(p) for p in prompts) + max_new_tokens,
                      dtype=kv_dtype(kv_type))
    slots = [cache.acquire() for _ in prompts]
    out: list[list[int]] = []
    with torch.no_grad():
        for slot, p in zip(slots, prompts):                    # each prompt prefilled alone, in its slot
            logits = forward_batch(model, cache, [Feed(slot, list(p))], LAST_ROW)[0].logits
            out.append([int(logits[0].argmax())])
        live = [b for b, o in enumerate(out) if not _done(o, ends, max_new_tokens)]
        while live:
            logits = forward_batch(model, cache, [Feed(slots[b], out[b][-1:]) for b in live])[0].logits   # [S, V]
            for b, t in zip(live, logits.argmax(-1).tolist()):
                out[b].append(t)
            live = [b for b in live if not _done(out[b], ends, max_new_tokens)]
    return [o[:-1] if o[-1] in ends else o for o in out]


def _done(ids: list[int], ends: set[int], max_new_tokens: int) -> bool:
    return len(ids) >= max_new_tokens or ids[-1] in ends
