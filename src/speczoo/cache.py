"""KVCache: preallocated per-layer key/value storage with an integer length.

The committed prefix is a linear sequence: slot index == position. A forward writes the K/V of its S new
tokens at slots [length, length + S) and advances `length`; speculative decoding then rolls back with
`truncate` (O(1): only the integer moves) or, after a token tree, keeps the accepted path with `compact`
followed by `truncate`. Capacity is fixed at construction (max_seq + extra slots, the extra covering a
verify of K + 1 tokens past max_seq) and this module must never reallocate or grow it; running out is a
`CacheFullError` raised by the model before anything is written.

A hybrid model (ModelArgs.conv_layers: LFM2's short convolutions) keeps K/V for its attention layers only
(`k[i]`, `v[i]` for the i-th of args.kv_layers) and its convolution state in `conv` (models/conv_rows.py):
the inputs of each sequence's last rows, so that `truncate` and `compact` roll that state back exactly too,
still by the integer length; a length further back than its reach is refused (CacheFullError).
"""

from __future__ import annotations

import math
import mmap

import torch
from torch import Tensor

from speczoo.errors import CacheFullError
from speczoo.models.args import ModelArgs
from speczoo.models.conv_rows import ConvRows


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """Zeros in an anonymous memory map: the OS hands out each zero page when it is first touched, so a
    cache sized for the model's whole context takes memory only as its slots fill (torch.zeros writes
    every page at once: the 1.5B's 32k-slot fp16 cache added 0.9 GB to the process at load). Page-aligned;
    the tensor keeps the map alive."""
    count = math.prod(shape)
    if count == 0:                   # a hybrid model's one convolution layer keeps no K/V at all
        return torch.zeros(shape, dtype=dtype)
    size = count * dtype.itemsize
    # private: a forked child (a server's worker) gets its own copy, not this process's slots
    buf = (mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if hasattr(mmap, "MAP_PRIVATE")
           else mmap.mmap(-1, size))
    return torch.frombuffer(buf, dtype=dtype, count=count).view(shape)


class KVCache:
    """Keys and values of every attention layer: `k[i]`, `v[i]` are views [Hkv, C, Dh] (C = capacity); the
    convolution state of a hybrid model's other layers in `conv` (None for a model of attention only).
    segments: sequences of capacity / segments slots each side by side (a SlotCache's), each with its own
    convolution state."""

    def __init__(self, args: ModelArgs, max_seq: int, extra: int = 64, dtype: torch.dtype = torch.float32,
                 segments: int = 1):
        if max_seq <= 0 or extra < 0:
            raise ValueError(f"KVCache needs max_seq > 0 and extra >= 0, got max_seq={max_seq}, extra={extra}")
        self.args = args
        self.max_seq = max_seq
        self.capacity = max_seq + extra
        self.dtype = dtype
        shape = (len(args.kv_layers), args.n_kv_heads, self.capacity, args.head_dim)
        self._k = lazy_zeros(shape, dtype)   # [L, Hkv, C, Dh]
        self._v = lazy_zeros(shape, dtype)   # [L, Hkv, C, Dh]
        self.k: list[Tensor] = list(self._k.unbind(0))   # per layer [Hkv, C, Dh] views
        self.v: list[Tensor] = list(self._v.unbind(0))
        self.conv = (ConvRows(len(args.conv_layers), args.dim, args.conv_kernel - 1, self.capacity, extra, segments)
                     if args.conv_layers else None)
        self.length = 0

    def __repr__(self) -> str:
        return (f"KVCache(layers={self.args.n_layers}, length={self.length}, capacity={self.capacity}, "
                f"dtype={self.dtype})")

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held, and of a hybrid model's convolution state (slots.py's memory bound)."""
        return self._k.numel() * self._k.element_size() * 2 + (0 if self.conv is None else self.conv.nbytes)

    def check_room(self, n_new: int) -> None:
        """Raise CacheFullError (before anything is written) when n_new more slots do not fit."""
        if self.length + n_new > self.capacity:
            raise CacheFullError(
                f"the KV cache holds {self.capacity} slots ({self.max_seq} + {self.capacity - self.max_seq} spare) "
                f"and {self.length} are used; {n_new} more tokens do not fit. Shorten the prompt or the "
                f"generation, or raise --max-seq.")

    def truncate(self, n: int) -> None:
        """Keep the first n slots (0 <= n <= length). O(1): the data past n is simply overwritten later."""
        if not 0 <= n <= self.length:
            raise ValueError(f"KVCache.truncate({n}) needs 0 <= n <= length ({self.length})")
        if self.conv is not None:
            self.conv.check(0, n)
        self.length = n

    def compact(self, src: list[int], dst: int) -> None:
        """Copy slots `src` (ascending absolute indices) to dst, dst+1, ... in every layer.

        Tree verify uses it to move the accepted path next to the prefix; the caller then truncates to
        dst + len(src). Slots must lie below `length`, and dst <= src[0] so that an ascending copy never
        overwrites a slot before it is read.
        """
        if not src:
            return
        if any(b <= a for a, b in zip(src, src[1:])):
            raise ValueError(f"KVCache.compact: src must be strictly ascending, got {src}")
        if src[0] < 0 or src[-1] >= self.length:
            raise ValueError(f"KVCache.compact: src {src} must lie in [0, length={self.length})")
        if not 0 <= dst <= src[0]:
            raise ValueError(f"KVCache.compact: dst ({dst}) must satisfy 0 <= dst <= src[0] ({src[0]})")
        if src == list(range(dst, dst + len(src))):
            return  # already in place (a chain, or a tree whose accepted path is its first branch)
        idx = torch.tensor(src, dtype=torch.long)
        n = len(src)
        # index_select makes a copy first, so overlapping ranges are safe.
        self._k[:, :, dst:dst + n] = self._k.index_select(2, idx)   # [L, Hkv, n, Dh]
        self._v[:, :, dst:dst + n] = self._v.index_select(2, idx)
        if self.conv is not None:
            self.conv.compact(src, dst)

    def copy(self, src: int, dst: int, n: int) -> None:
        """Copy slots [src, src + n) to [dst, dst + n) in every layer (the ranges must not overlap)."""
        if n <= 0:
            return
        if min(src, dst) < 0 or max(src, dst) + n > self.capacity or abs(src - dst) < n:
            raise ValueError(f"KVCache.copy({src}, {dst}, {n}): ranges must lie in the cache and not overlap")
        self._k[:, :, dst:dst + n] = self._k[:, :, src:src + n]
        self._v[:, :, dst:dst + n] = self._v[:, :, src:src + n]

    def reset(self) -> None:
        self.length = 0
        if self.conv is not None:
            self.conv.reset()
