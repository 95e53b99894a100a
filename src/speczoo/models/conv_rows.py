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

    gather: [W, S] int64 rows of cat(ring, this forward's inputs): row i's predecessors, oldest first
    to, src: [M] ring rows written and the forward rows written there (the last writer of each ring row)
    """

    gather: Tensor
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

    def plan(self, prev: Tensor, dest: Tensor) -> ConvPlan:
        """The plan of a forward whose row i goes to cache slot dest[i] ([S] int64) and reads the slots
        prev[i] ([S, W] int64, oldest first, -1 before its sequence's start); a predecessor among this
        forward's rows is read from the forward itself. The forward is about to run: each written
        segment's floor rises past the rows its ring gives up."""
        s = dest.shape[0]
        ordered, order = dest.sort()
        at = torch.searchsorted(ordered, prev).clamp(max=s - 1)                   # [S, W]
        own = ordered[at] == prev
        gather = torch.where(prev < 0, self.zero, self._ring(prev.clamp(min=0)))
        gather = torch.where(own, self.zero + 1 + order[at], gather)
        last: dict[int, int] = {}                                                 # ring row -> its last writer
        for row, r in zip(order.tolist(), self._ring(ordered).tolist()):
            last[r] = row
        for seg, top in self._tops(ordered).items():
            self.floor[seg] = max(self.floor[seg], top - self.ring + self.width + 1)
        return ConvPlan(gather=gather.t().contiguous(), to=torch.tensor(list(last), dtype=torch.int64),
                        src=torch.tensor(list(last.values()), dtype=torch.int64))

    def _tops(self, ordered: Tensor) -> dict[int, int]:
        """Segment -> the furthest position written in it, of sorted cache slots."""
        tops: dict[int, int] = {}
        for slot in ordered.tolist():
            tops[slot // self.segment] = slot % self.segment
        return tops

    def window(self, layer: int, u: Tensor, plan: ConvPlan) -> Tensor:
        """The W predecessors' inputs of each row, [W, S, D] oldest first; u: this forward's inputs [S, D]."""
        own = plan.gather > self.zero                                             # [W, S]
        held = self.rows[layer][plan.gather.clamp(max=self.zero)]                 # [W, S, D]
        return torch.where(own[..., None], u[(plan.gather - self.zero - 1).clamp(min=0)], held)

    def store(self, layer: int, u: Tensor, plan: ConvPlan) -> None:
        """Keep this forward's inputs u [S, D] in the layer's ring (after every row has read its window)."""
        self.rows[layer, plan.to] = u[plan.src]

    def state(self, n: int, segment: int = 0) -> Tensor:
        """The convolution state after n rows of `segment`: every layer's last W inputs [L, W, D], oldest
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
