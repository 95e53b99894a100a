"""ConvRows: the inputs of a hybrid model's short-convolution layers over each sequence's last rows, so that
a speculative rollback restores the convolution state with the cache's integer length alone.

A short convolution of L taps (LFM2's) reads at every row its own input u and the inputs of the W = L - 1
rows before it: its state after n rows is u[n - W : n]. Instead of that state, ConvRows keeps u of the
last R = W + reach rows of each sequence in a ring (position p in ring row p mod R). The state after any
length n no more than `reach` rows behind the furthest row written is then rows [n - W, n) of the ring,
intact: these are the per-row states of a verify, each stored once. A verify of K + 1 rows writes them;
rolling back to j + 1 of them is the KV cache's `truncate` (no copy: the ring already holds the state
after every row); a token tree's accepted path moves like its K/V rows (`compact`). A length the ring no
longer holds (a rollback further than `reach` rows) is refused by `check`, never restored wrongly.

Sequences: the cache's slots split into `segments` equal ranges (one per sequence of a SlotCache; one
for a KVCache), each with its own ring. A row's window is named by the cache slots of its W predecessors
(-1: before the sequence's start, which reads zeros), so chains, token trees and rows of several
sequences are planned alike. This module holds tensors and index arithmetic only: it never runs a layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.errors import CacheFullError

MIN_REACH = 128     # rows a rollback may undo at least: a verify (MAX_K + 1 = 65) or a draft's chain and guesses


@dataclass(frozen=True)
class ConvPlan:
    """Where one forward's rows read their windows and write their inputs (the same for every layer).

    held, own: [H] ring rows and [O] forward rows that the windows read; pos: [W * S] where window k of
    row i (at k * S + i) lies in cat(held rows, own rows). to, src: [M] ring rows written and the forward
    rows written there (the last writer of each ring row). Index vectors only: a window is two
    index_selects and a permutation, whatever S is (no elementwise masking, which torch would spread over
    threads for nothing).
    """

    held: Tensor
    own: Tensor
    pos: Tensor
    to: Tensor
    src: Tensor


class ConvRows:
    """Inputs [n_layers, segments * R + 1, D] fp32; the last row is zeros (before a sequence's start)."""

    def __init__(self, n_layers: int, dim: int, width: int, capacity: int, reach: int, segments: int = 1):
        if width < 1 or segments < 1 or capacity % segments:
            raise ValueError(f"ConvRows needs width >= 1 and capacity ({capacity}) split into {segments} equal "
                             "segments")
        self.width = width
        self.ring = width + max(reach, MIN_REACH)               # R
        self.segment = capacity // segments                      # cache slots per sequence
        self.segments = segments
        self.zero = segments * self.ring                         # the row of zeros
        self.rows = torch.zeros(n_layers, self.zero + 1, dim)
        self.floor = [0] * segments      # the shortest length > 0 whose state each ring still holds

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def _ring(self, slots: Tensor) -> Tensor:
        """Cache slots (int64, >= 0) -> their ring rows."""
        return (slots // self.segment) * self.ring + (slots % self.segment) % self.ring

    def _row(self, slot: int) -> int:
        """One cache slot's ring row (-1, before a sequence's start: the row of zeros)."""
        return self.zero if slot < 0 else (slot // self.segment) * self.ring + (slot % self.segment) % self.ring

    def plan(self, prev: list[list[int]], dest: list[int]) -> ConvPlan:
        """The plan of a forward whose row i goes to cache slot dest[i] and reads the slots prev[i] (W of
        them, oldest first, -1 before its sequence's start); a predecessor among this forward's rows is read
        from the forward itself. The forward is about to run: each written segment's floor rises past the
        rows its ring gives up. Plain Python over S * W ints: cheaper than a dozen small tensor ops for a
        verify's rows, and a prefill's are few beside its forward."""
        row_of = {slot: i for i, slot in enumerate(dest)}
        held: list[int] = []
        own: list[int] = []
        pos: list[int] = []                              # held: its index; own: -1 - its index (fixed below)
        for k in range(self.width):
            for i in range(len(dest)):
                j = row_of.get(prev[i][k])
                if j is None:
                    pos.append(len(held))
                    held.append(self._row(prev[i][k]))
                else:
                    pos.append(-1 - len(own))
                    own.append(j)
        pos = [p if p >= 0 else len(held) - 1 - p for p in pos]
        last: dict[int, int] = {}                        # ring row -> its last writer (a prefill may wrap)
        top: dict[int, int] = {}                         # segment -> its furthest slot written
        for slot in sorted(row_of):
            last[self._row(slot)] = row_of[slot]
            top[slot // self.segment] = slot % self.segment
        for seg, at in top.items():
            self.floor[seg] = max(self.floor[seg], at - self.ring + self.width + 1)
        return ConvPlan(held=torch.tensor(held, dtype=torch.int64), own=torch.tensor(own, dtype=torch.int64),
                        pos=torch.tensor(pos, dtype=torch.int64), to=torch.tensor(list(last), dtype=torch.int64),
                        src=torch.tensor(list(last.values()), dtype=torch.int64))

    def window(self, layer: int, u: Tensor, plan: ConvPlan) -> Tensor:
        """The W predecessors' inputs of each row, [W, S, D] oldest first; u: this forward's inputs [S, D]."""
        rows = torch.cat((self.rows[layer].index_select(0, plan.held), u.index_select(0, plan.own)))
        return rows.index_select(0, plan.pos).view(self.width, u.shape[0], u.shape[1])

    def store(self, layer: int, u: Tensor, plan: ConvPlan) -> None:
        """Keep this forward's inputs u [S, D] in the layer's ring (after every row has read its window)."""
        self.rows[layer].index_copy_(0, plan.to, u.index_select(0, plan.src))

    def state(self, n: int, segment: int = 0) -> Tensor:
        """The convolution state after n rows of `segment`: every layer's last W inputs [layers, W, D], oldest
        first (zeros before the sequence's start)."""
        self.check(segment, n)
        slots = torch.arange(n - self.width, n) + segment * self.segment
        return self.rows[:, torch.where(slots < segment * self.segment, self.zero, self._ring(slots.clamp(min=0)))]

    def holds(self, segment: int, n: int) -> bool:
        """Whether the ring of `segment` holds the state after n rows."""
        return not 0 < n < self.floor[segment]

    def check(self, segment: int, n: int) -> None:
        """Raise unless the ring of `segment` holds the state after n rows."""
        if not self.holds(segment, n):
            raise CacheFullError(
                f"the short-convolution state after {n} rows is no longer held: the cache keeps the inputs of "
                f"the last {self.ring} rows of a sequence, so a rollback may go back to length "
                f"{self.floor[segment]} at the earliest; recompute from the start instead")

    def compact(self, src: list[int], dst: int) -> None:
        """Cache slots `src` (ascending, one segment) move to dst, dst + 1, ... (KVCache.compact's rows)."""
        to = self._ring(torch.arange(dst, dst + len(src)))
        self.rows[:, to] = self.rows[:, self._ring(torch.tensor(src))]           # index_select copies first

    def copy_state(self, src: int, dst: int, n: int) -> None:
        """Segment `dst` takes the state after n rows of segment `src` (a shared prompt prefix, slots.py); it
        holds no earlier one."""
        self.check(src, n)
        slots = torch.arange(max(0, n - self.width), n)
        self.rows[:, self._ring(slots + dst * self.segment)] = self.rows[:, self._ring(slots + src * self.segment)]
        self.floor[dst] = n

    def reset(self, segment: int | None = None) -> None:
        """A sequence starts afresh in `segment` (None: every one); its rows are rewritten before read."""
        for seg in range(self.segments) if segment is None else [segment]:
            self.floor[seg] = 0
