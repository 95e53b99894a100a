"""Batch-invariant attention over a layer's KV cache: a compiled kernel and its pure-PyTorch twin.

Each query row i attends to its own ordered key list (`KeyRows`): a contiguous slot range, then extra
slots (a token tree's new slots). The result of row i depends only on q[i] and the sequence of key/value
vectors it sees, never on S, on the other rows or on the thread count, so a verify forward of K + 1 rows
gives the same bits as K + 1 single-row decode steps (and a tree row the same bits as the decode of its
path after `KVCache.compact`). GQA: q-head h reads kv-head h // (H / Hkv).

The cache holds fp32 or fp16 (`KV_FORMATS`): an fp16 key or value is widened to fp32 exactly as the kernel
loads it, so every path computes the same fp32 arithmetic over the stored values. `attend` runs the
compiled kernel (speczoo/kernels/cpu_kernels.cpp, `sz_attend`) for either; `attend_torch` is the reference
twin (same math, torch's own reduction order: equal to round-off, not bitwise). `attend` takes the twin only
for another cache dtype, or when the kernels cannot be built, and then says so once with a warning. This
module must never write to the cache or look at the linear backend.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.kernels import native

# The cache element types the compiled kernels read, and their codes (cpu_kernels.h: SZ_FMT_F32, SZ_FMT_F16).
KV_FORMATS: dict[torch.dtype, int] = {torch.float32: 4, torch.float16: 5}


@dataclass
class KeyRows:
    """Which cache slots each query row sees, in order: [lo[i], hi[i]) then idx[off[i]:off[i + 1]]."""

    lo: Tensor    # [S] int64
    hi: Tensor    # [S] int64
    off: Tensor   # [S + 1] int64
    idx: Tensor   # [T] int64, extra slots of all rows, concatenated

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[int, int] | Tensor]) -> KeyRows:
        """rows[i]: (lo, hi) for a slot range, or a 1-D LongTensor of slots (taken as the extra list)."""
        lo, hi, off, extra = [], [], [0], []
        for row in rows:
            if isinstance(row, tuple):
                lo.append(int(row[0]))
                hi.append(int(row[1]))
            else:
                lo.append(0)
                hi.append(0)
                extra.append(row.reshape(-1).to(torch.int64))
            off.append(off[-1] + (0 if isinstance(row, tuple) else extra[-1].numel()))
        idx = torch.cat(extra) if extra else torch.zeros(0, dtype=torch.int64)
        return cls(torch.tensor(lo, dtype=torch.int64), torch.tensor(hi, dtype=torch.int64),
                   torch.tensor(off, dtype=torch.int64), idx.contiguous())

    @property
    def n_rows(self) -> int:
        return self.lo.shape[0]

    def slots(self, i: int) -> Tensor:
        """Row i's key slots in order, [n_i] int64."""
        rng = torch.arange(int(self.lo[i]), int(self.hi[i]), dtype=torch.int64)
        return torch.cat((rng, self.idx[int(self.off[i]):int(self.off[i + 1])]))


def _check(q: Tensor, k_cache: Tensor, v_cache: Tensor, keys: KeyRows) -> tuple[int, int, int, int]:
    if q.dim() != 3 or k_cache.dim() != 3 or k_cache.shape != v_cache.shape:
        raise ValueError(f"attend expects q[S, H, Dh] and k/v caches [Hkv, C, Dh]; got q {tuple(q.shape)}, "
                         f"k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    s, h, dh = q.shape
    hkv = k_cache.shape[0]
    if k_cache.shape[2] != dh or h % hkv:
        raise ValueError(f"q has {h} heads of {dh}; the cache has {hkv} kv-heads of {k_cache.shape[2]} "
                         "(the head sizes must match and H must be a multiple of Hkv)")
    if keys.n_rows != s:
        raise ValueError(f"the key plan has {keys.n_rows} rows, q has {s}")
    return s, h, dh, hkv


def attend_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, keys: KeyRows, softcap: float = 0.0) -> Tensor:
    """Reference twin: q [S, H, Dh] fp32 (scaled, rotated); k/v caches [Hkv, C, Dh]; softcap > 0: scores
    capped to softcap * tanh(scores / softcap) before the softmax. Returns [S, H, Dh]."""
    s, h, dh, hkv = _check(q, k_cache, v_cache, keys)
    qg = q.view(s, hkv, h // hkv, dh)                              # [S, Hkv, G, Dh]
    out = torch.empty(s, hkv, h // hkv, dh, dtype=q.dtype)
    for i in range(s):
        lo, hi = int(keys.lo[i]), int(keys.hi[i])
        a, b = int(keys.off[i]), int(keys.off[i + 1])
        if a == b:
            k, v = k_cache[:, lo:hi], v_cache[:, lo:hi]            # [Hkv, n_i, Dh] views
        else:
            sl = keys.slots(i)
            k, v = k_cache.index_select(1, sl), v_cache.index_select(1, sl)   # [Hkv, n_i, Dh]
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        scores = torch.matmul(qg[i], k.transpose(1, 2))           # [Hkv, G, n_i]
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        torch.matmul(torch.softmax(scores, dim=-1), v, out=out[i])  # [Hkv, G, Dh]
    return out.view(s, h, dh)


class Plan:
    """KeyRows plus the ctypes arguments the kernel needs; build once per forward, use in every layer."""

    def __init__(self, keys: KeyRows):
        self.keys = keys
        self.lo, self.hi = keys.lo.contiguous(), keys.hi.contiguous()
        self.off, self.idx = keys.off.contiguous(), keys.idx.contiguous()
        self.args = (self.lo.data_ptr(), self.hi.data_ptr(), self.off.data_ptr(), self.idx.data_ptr())


_FAILED: list[str] = []   # the build error, once building failed (warned once)


def _lib() -> native.NativeKernels | None:
    """The kernels of the path chosen for this CPU (native.kernels caches them per path)."""
    if _FAILED:
        return None
    try:
        return native.kernels()
    except native.KernelBuildError as err:
        warnings.warn(f"batch-invariant attention runs in PyTorch (slower): {err}", RuntimeWarning, stacklevel=3)
        _FAILED.append(str(err))
        return None


def attend(q: Tensor, k_cache: Tensor, v_cache: Tensor, keys: KeyRows | Plan,
           lib: native.NativeKernels | None = None, softcap: float = 0.0) -> Tensor:
    """q [S, H, Dh] fp32 (scaled, rotated); k/v caches [Hkv, C, Dh] of one layer (fp32 or fp16). Returns [S, H, Dh]
    fp32.

    `lib` picks a build of the kernels (tests pass other paths); default: the path chosen for this CPU.
    softcap > 0: attention logit soft-capping (Gemma 2), scores = softcap * tanh(scores / softcap), row by
    row like everything here (the kernel's tanh is its own lane-wise formula, the same bits on every path).
    """
    plan = keys if isinstance(keys, Plan) else Plan(keys)
    s, h, dh, hkv = _check(q, k_cache, v_cache, plan.keys)
    if q.dtype != torch.float32 or k_cache.dtype not in KV_FORMATS or v_cache.dtype != k_cache.dtype:
        return attend_torch(q, k_cache, v_cache, plan.keys, softcap)   # the kernel reads fp32 / fp16 caches only
    lib = lib if lib is not None else _lib()
    if lib is None:
        return attend_torch(q, k_cache, v_cache, plan.keys, softcap)
    if not q.is_contiguous():
        q = q.contiguous()
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("attend needs contiguous per-layer caches [Hkv, C, Dh] (KVCache.k[layer] is one)")
    out = torch.empty(s, h, dh)                                    # [S, H, Dh]
    rc = lib.attend_fn(q.data_ptr(), s, h, dh, k_cache.data_ptr(), v_cache.data_ptr(), KV_FORMATS[k_cache.dtype],
                       hkv, k_cache.shape[1],
                       *plan.args, softcap, out.data_ptr(), torch.get_num_threads())
    if rc == -1:
        raise MemoryError(f"attention kernel could not allocate its scratch (S={s}, H={h}, Dh={dh})")
    if rc != 0:
        raise ValueError(f"attention key plan is invalid for a cache of {k_cache.shape[1]} slots: every row needs "
                         "at least one key and every slot must lie inside the cache")
    return out
