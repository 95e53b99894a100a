"""SlotCache: the KV of several sequences in one preallocated cache, one fixed slot range each, so that
rows of different sequences go through ONE target forward (continuous batching).

Slot b owns cache rows [b * C, (b + 1) * C) of every layer (C = the slot's capacity): inside its range,
row index == position, as in a KVCache of its own, and its length is an integer, so a rollback is O(1)
(`truncate`) and a token tree keeps its accepted path with `compact`. `plan` turns what each sequence
feeds this step (a chain of new tokens, or a token tree) into the forward's tokens, positions, the cache
rows the new K/V go to (`dest`) and the attention keys of every row (its own slot's prefix, then its own
new rows), so rows of different sequences never see each other. With the batch-invariant kernels every
row's logits are then the same bits as in a forward of that sequence alone (tests/test_slots.py).

Prompt prefixes are reused: each slot remembers the token ids of its rows, kept after `release` until
the slot is written again, and `acquire(prompt)` starts a new sequence on the longest prefix of its
prompt that any slot holds, copied in where it lies in another slot; the sequence feeds only the rest.
A row's K/V depends only on the tokens at and before its position (the kernels are batch-invariant, and
chunking a prefill changes no bits), so reused rows are the bits the sequence would compute itself: a
chat's system prompt, or an earlier turn of the same conversation, is prefilled once. Kept rows are
evicted with care: a free slot is taken in place only when all it keeps is a prefix of the new prompt
(a conversation's next turn), else an empty one, else the one released longest ago, so that a server's
conversations keep their turns while new ones arrive.

A hybrid model's convolution state (models/conv_rows.py) lives beside each slot's K/V, one ring per slot:
a rollback checks that the state is held, and a prompt prefix is reused only at a length whose state its
slot still holds (the length a sequence left it at, or within the last rows it wrote), the state then
copied with the K/V when the prefix lies in another slot.

This module never runs a model and never grows the cache; a sequence that outgrows its slot is a
CacheFullError raised by `plan`, before anything is written. Sliding-window models (Gemma 3) are not
supported: their layers would need a second key plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.cache import KVCache
from speczoo.errors import CacheFullError
from speczoo.kernels.attention import KeyRows
from speczoo.models.args import ModelArgs
from speczoo.models.forward import EVERY_ROW, Packed, Readout


@dataclass(frozen=True)
class Feed:
    """What one sequence feeds a batched forward: `tokens` after its committed prefix; `parents` None for
    a chain, else a token tree (parents[i] < i, -1 for a child of the prefix's last token)."""

    slot: int
    tokens: list[int]
    parents: list[int] | None = None


@dataclass(frozen=True)
class Batch:
    """One batched forward's inputs: rows of every feed in order (feed j's rows are `rows[j]`)."""

    tokens: Tensor          # [S] int64
    positions: Tensor       # [S] int64
    dest: Tensor            # [S] int64 cache rows the new K/V go to
    keys: KeyRows           # the rows each row attends to, in order
    rows: list[slice]       # feed j -> its rows of the forward's output


class SlotCache:
    """n_slots sequences of up to slot_capacity tokens each (prompt, generation and a verify's draft)."""

    def __init__(self, args: ModelArgs, n_slots: int, slot_capacity: int, dtype: torch.dtype = torch.float32):
        if n_slots < 1 or slot_capacity < 1:
            raise ValueError(f"SlotCache needs n_slots >= 1 and slot_capacity >= 1, got {n_slots}, {slot_capacity}")
        if args.sliding_window > 0:
            raise ValueError(f"a SlotCache cannot hold a model with sliding-window layers ({args.arch})")
        self.n_slots = n_slots
        self.slot_capacity = slot_capacity
        self.kv = KVCache(args, n_slots * slot_capacity, extra=0, dtype=dtype, segments=n_slots)
        self.kv.length = self.kv.capacity        # rows are addressed explicitly; lengths live per slot
        self.lengths = [0] * n_slots
        self.ids: list[list[int]] = [[] for _ in range(n_slots)]   # the token of each row; kept when free
        self._free = list(range(n_slots - 1, -1, -1))
        self._released = [0] * n_slots      # when each slot was last released (a counter): the oldest goes first
        self._clock = 0

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes

    @property
    def free(self) -> int:
        """How many slots are not held by a sequence."""
        return len(self._free)

    def acquire(self, prompt: Sequence[int] = ()) -> int:
        """A free slot for a sequence that will start with `prompt`; CacheFullError when every slot is held.
        Its length is the prompt prefix it already holds (at most len(prompt) - 1: the last prompt token is
        always fed, for its logits). The slot: the free one whose kept rows are all a prefix of the prompt
        (the longest), else an empty one (lowest index first), else the one released longest ago; then a
        longer shared prefix held by any slot is copied in."""
        if not self._free:
            raise CacheFullError(f"all {self.n_slots} sequence slots are in use")
        cap = max(0, len(prompt) - 1)
        shared = {s: self._held(s, _shared(self.ids[s], prompt, cap)) for s in range(self.n_slots)}
        extends = [s for s in self._free if self.ids[s] and shared[s] == len(self.ids[s])]
        if extends:
            slot = max(extends, key=lambda s: (shared[s], -s))
        else:
            slot = min(self._free, key=lambda s: (bool(self.ids[s]), self._released[s], s))
        self._free.remove(slot)
        keep = shared[slot]
        src = max(range(self.n_slots), key=lambda s: shared[s])
        if shared[src] > keep:
            base, src_base = slot * self.slot_capacity, src * self.slot_capacity
            self.kv.copy(src_base + keep, base + keep, shared[src] - keep)
            keep = shared[src]
            if self.kv.conv is not None:
                self.kv.conv.copy_state(src, slot, keep)
        elif self.kv.conv is not None and keep == 0:
            self.kv.conv.reset(slot)
        self.lengths[slot] = keep
        self.ids[slot] = list(prompt[:keep])
        return slot

    def _held(self, slot: int, n: int) -> int:
        """n, or 0 when slot's rows up to n cannot be reused (a hybrid's state after them is not held)."""
        return n if self.kv.conv is None or self.kv.conv.holds(slot, n) else 0

    def release(self, slot: int) -> None:
        """Give a slot back; its rows stay for a later prompt that shares their prefix, until the slot is
        acquired again."""
        self._check_slot(slot)
        if slot in self._free:
            raise ValueError(f"slot {slot} is not held")
        del self.ids[slot][self.lengths[slot]:]
        self.lengths[slot] = 0
        self._free.append(slot)
        self._clock += 1
        self._released[slot] = self._clock

    def truncate(self, slot: int, n: int) -> None:
        """Keep the first n rows of a slot (0 <= n <= its length). O(1)."""
        self._check_slot(slot)
        if not 0 <= n <= self.lengths[slot]:
            raise ValueError(f"truncate({slot}, {n}) needs 0 <= n <= the slot's length ({self.lengths[slot]})")
        if self.kv.conv is not None:
            self.kv.conv.check(slot, n)
        self.lengths[slot] = n
        del self.ids[slot][n:]

    def compact(self, slot: int, src: list[int], dst: int) -> None:
        """KVCache.compact inside one slot: positions `src` (ascending) move to dst, dst + 1, ..."""
        self._check_slot(slot)
        base = slot * self.slot_capacity
        self.kv.compact([base + i for i in src], base + dst)
        ids = self.ids[slot]
        ids[dst:dst + len(src)] = [ids[i] for i in src]

    def plan(self, feeds: Sequence[Feed]) -> Batch:
        """The batched forward for `feeds` (one per sequence, distinct slots) and each slot's new length
        once the forward has run (`commit`). Raises CacheFullError when a feed does not fit its slot."""
        if len({f.slot for f in feeds}) != len(feeds):
            raise ValueError("a batched forward takes at most one feed per slot")
        tokens: list[int] = []
        positions: list[int] = []
        dest: list[int] = []
        key_rows: list[tuple[int, int] | Tensor] = []
        rows: list[slice] = []
        for f in feeds:
            self._check_slot(f.slot)
            n, length = len(f.tokens), self.lengths[f.slot]
            if n == 0:
                raise ValueError(f"slot {f.slot}: a feed needs at least one token")
            if length + n > self.slot_capacity:
                raise CacheFullError(
                    f"sequence slot {f.slot} holds {self.slot_capacity} tokens and {length} are used; {n} more "
                    "do not fit. Shorten the prompt or the generation, or raise --max-seq.")
            base = f.slot * self.slot_capacity
            start = len(tokens)
            tokens += f.tokens
            dest += range(base + length, base + length + n)
            if f.parents is None:
                positions += range(length, length + n)
                key_rows += [(base, base + length + i + 1) for i in range(n)]
            else:
                depth = _depths(f.parents)
                positions += [length + d for d in depth]
                prefix = torch.arange(base, base + length, dtype=torch.int64)
                for i in range(n):
                    path = _path(f.parents, i)
                    key_rows.append(torch.cat((prefix, torch.tensor([base + length + j for j in path],
                                                                    dtype=torch.int64))))
            rows.append(slice(start, len(tokens)))
        return Batch(tokens=torch.tensor(tokens, dtype=torch.int64),
                     positions=torch.tensor(positions, dtype=torch.int64),
                     dest=torch.tensor(dest, dtype=torch.int64), keys=KeyRows.from_rows(key_rows), rows=rows)

    def commit(self, feeds: Sequence[Feed]) -> None:
        """After the forward: each fed slot holds its new rows (roll back with truncate/compact)."""
        for f in feeds:
            self.lengths[f.slot] += len(f.tokens)
            self.ids[f.slot] += f.tokens

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} out of range 0..{self.n_slots - 1}")


def _shared(ids: list[int], prompt: Sequence[int], cap: int) -> int:
    """How many leading tokens `ids` and `prompt` share, at most `cap`."""
    n = 0
    for a, b in zip(ids, prompt[:cap]):
        if a != b:
            break
        n += 1
    return n


def _depths(parents: list[int]) -> list[int]:
    depth: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"tree parents must satisfy -1 <= parents[i] < i; got parents[{i}] = {p}")
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def _path(parents: list[int], i: int) -> list[int]:
    """Node i's ancestors, root first, then i itself."""
    path = [i]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def forward_batch(model, cache: SlotCache, feeds: Sequence[Feed], readout: Readout = EVERY_ROW):
    """One target forward over every feed's rows (their K/V written into their own slots), then each fed
    slot's length advanced. Returns the model's ForwardOut; feed j's logits are `out.logits[batch.rows[j]]`
    with `batch` the second value (when `readout` asks for every row's logits)."""
    batch = cache.plan(feeds)
    out = model(batch.tokens, batch.positions, cache.kv, attend=Packed(batch.keys, batch.dest), readout=readout)
    cache.commit(feeds)
    return out, batch
