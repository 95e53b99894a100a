"""Qwen2-shaped decoder blocks run as ONE compiled call (cpu_block.cpp, `sz_qwen_blocks`): one block
(`NativeBlock`), or a run of them (`NativeStack`). The shape: pre-norm, q/k/v (optional bias, optional
per-head RMSNorm of q and k), NEOX RoPE, a SiLU-gated MLP; Qwen2, Llama, Qwen3 and Phi-3 blocks have it.

The block's forward in PyTorch is ~40 small operations (norms, RoPE, cache writes, residual adds, SiLU)
around four linear calls and the attention; on two cores their dispatch costs about a fifth of a decode
step. When every linear of a block is a compiled kernel of any format (q4, q8, q8b, q8bm, q40, q50, q80, q6, or
the float formats f32, f16, bf16; with q/k/v and gate/up fused where they share a format) the whole block runs in
C++ instead: the same linear and attention routines, the elementwise steps written out
row by row, so the forward stays batch-invariant (tests/kernels/test_block.py holds it to that and to the
PyTorch composition within round-off). It takes an fp32 or fp16 cache (an fp16 row rounded once when it
is written, as PyTorch's copy rounds it) and must never be used for another cache dtype or a batched
(non-invariant) attention plan: the block asks `supports` first.

Calling the blocks one by one from Python costs about 40 µs each (the ctypes call's argument conversion,
the copies of the inputs, an OpenMP region per block): about a millisecond of a 10 ms draft-model step.
`NativeStack` runs all of a model's blocks, or a range of them, in one call and one OpenMP region, with
the same arithmetic, so its output is bit-identical to the block-by-block run (a block alone is a stack
of one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from speczoo.kernels import native
from speczoo.kernels.attention import KV_FORMATS
from speczoo.kernels.quantized import (FloatNative, Q4Native, Q6Native, Q8bmNative, Q8bNative, Q8Native, Q40Native,
                                      Q50Native, Q80Native)


def _descriptor(mod: nn.Module) -> list[int] | None:
    """[fmt, N, K, a, b, c, d, bias] of a compiled linear (pointers as ints), or None for any other module."""
    bias = 0 if mod.bias is None else mod.bias.data_ptr()
    if type(mod) is Q4Native:
        return [0, mod.n, mod.k, mod.qs.data_ptr(), mod.sc.data_ptr(), mod.mn.data_ptr(), mod.dd.data_ptr(), bias]
    if type(mod) is Q8Native:
        return [1, mod.n, mod.k, mod.w8.data_ptr(), 0, 0, mod.sw.data_ptr(), bias]
    if type(mod) is Q8bNative:
        return [2, mod.n, mod.k, mod.w8.data_ptr(), 0, 0, mod.sb.data_ptr(), bias]
    if type(mod) is Q8bmNative:
        return [7, mod.n, mod.k, mod.w8.data_ptr(), 0, mod.mb.data_ptr(), mod.sb.data_ptr(), bias]
    if type(mod) is Q40Native:
        return [8, mod.n, mod.k, mod.qs.data_ptr(), 0, 0, mod.sd.data_ptr(), bias]
    if type(mod) is Q50Native:
        return [9, mod.n, mod.k, mod.qs.data_ptr(), mod.qh.data_ptr(), 0, mod.sd.data_ptr(), bias]
    if type(mod) is Q80Native:
        return [10, mod.n, mod.k, mod.w8.data_ptr(), 0, 0, mod.sd.data_ptr(), bias]
    if type(mod) is Q6Native:
        return [3, mod.n, mod.k, mod.ql.data_ptr(), mod.qh.data_ptr(), mod.sc.data_ptr(), mod.dd.data_ptr(), bias]
    if isinstance(mod, FloatNative):
        return [mod.code, mod.n, mod.k, getattr(mod, mod.part).data_ptr(), 0, 0, 0, bias]
    return None


class NativeBlock:
    """The compiled forward of one pre-norm block: x += attn(norm1(x)); x += mlp(norm2(x)).

    Build it with `NativeBlock.build(...)`, which returns None when the block's linears are not all
    compiled kernels of one library (then the block keeps its PyTorch forward). q|k|v and gate|up may each
    be several calls of different formats (a Q4_K_M file's Q6_K v beside Q4_K q and k).
    """

    def __init__(self, lin: Tensor, norm1: Tensor, norm2: Tensor, eps: float, n_heads: int, n_kv_heads: int,
                 head_dim: int, lib: native.NativeKernels, keep: list[nn.Module], q_norm: Tensor | None = None,
                 k_norm: Tensor | None = None):
        self.lin = lin                       # [8 * 8] int64: qkv runs 0-2, wo, gate_up runs 4-5, down, unused
        self.norm1, self.norm2 = norm1.contiguous(), norm2.contiguous()
        self.q_norm = None if q_norm is None else q_norm.float().contiguous()   # [Dh] per-head norms, or None
        self.k_norm = None if k_norm is None else k_norm.float().contiguous()
        self.eps = eps
        self.h, self.hkv, self.dh = n_heads, n_kv_heads, head_dim
        self.lib = lib
        self._keep = keep                    # the modules whose weights the descriptors point into

    @classmethod
    def build(cls, qkv: Sequence[nn.Module], wo: nn.Module, gate_up: Sequence[nn.Module], down: nn.Module,
              norm1: Tensor, norm2: Tensor, eps: float, n_heads: int, n_kv_heads: int, head_dim: int,
              act: str, q_norm: Tensor | None = None, k_norm: Tensor | None = None) -> NativeBlock | None:
        """qkv and gate_up: the compiled runs of FusedLinears (`.runs`: one module when q|k|v share a
        format, up to three when they do not; gate|up up to two). q_norm, k_norm [Dh]: the per-head RMSNorm
        weights of q and k (Qwen3), both or neither."""
        if (act != "silu" or not 1 <= len(qkv) <= 3 or not 1 <= len(gate_up) <= 2
                or (q_norm is None) != (k_norm is None)):
            return None
        mods = [*qkv, wo, *gate_up, down]
        descs = [_descriptor(m) for m in mods]
        if any(d is None for d in descs) or len({id(m.lib) for m in mods}) != 1:
            return None
        none = [0] * 8                                           # an absent run: N = 0
        slots = [*descs[: len(qkv)], *[none] * (3 - len(qkv)), descs[len(qkv)],
                 *descs[len(qkv) + 1: -1], *[none] * (2 - len(gate_up)), descs[-1], none]
        lin = torch.tensor([v for d in slots for v in d], dtype=torch.int64)     # [8 * 8]
        return cls(lin, norm1, norm2, eps, n_heads, n_kv_heads, head_dim, mods[0].lib, mods, q_norm, k_norm)

    @staticmethod
    def supports(x: Tensor, k_cache: Tensor, keys, v_cache: Tensor | None = None) -> bool:
        """The compiled block takes an fp32 [S, D] input, a contiguous fp32 or fp16 cache (keys, and values of
        the same dtype when given) and a row-wise key plan."""
        return (keys is not None and x.dtype == torch.float32 and k_cache.dtype in KV_FORMATS
                and all(c.dtype == k_cache.dtype and c.is_contiguous() for c in (k_cache, v_cache) if c is not None))

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor, q_cos: Tensor, q_sin: Tensor, k_cache: Tensor,
                 v_cache: Tensor, at: int | Tensor, keys) -> Tensor:
        """This block alone: NativeStack.run over a stack of one (k_cache, v_cache: its layer's cache)."""
        return NativeStack([self]).run(x, cos, sin, q_cos, q_sin, [k_cache], [v_cache], at, keys)


class NativeStack:
    """All the compiled blocks of a model, run in one call: `run(x, ..., start, stop)` is
    `blocks[start:stop]` applied in turn, bit for bit. Build it with `NativeStack.build(blocks)`, which
    returns None unless every block is a NativeBlock of one library and one shape."""

    def __init__(self, blocks: list[NativeBlock]):
        self.blocks = blocks
        self._fn = blocks[0].lib.blocks_fn
        self._static = [(b.norm1.data_ptr(), b.norm2.data_ptr(), b.lin.data_ptr()) for b in blocks]
        self._qk = [tuple(0 if t is None else t.data_ptr() for t in (b.q_norm, b.k_norm)) for b in blocks]
        first = blocks[0]
        self.eps, self.h, self.hkv, self.dh = first.eps, first.h, first.hkv, first.dh

    @classmethod
    def build(cls, blocks: list[NativeBlock | None]) -> NativeStack | None:
        if not blocks or any(b is None for b in blocks):
            return None
        shapes = {(b.eps, b.h, b.hkv, b.dh) for b in blocks}       # type: ignore[union-attr]
        libs = {id(b.lib) for b in blocks}                        # type: ignore[union-attr]
        if len(shapes) != 1 or len(libs) != 1:
            return None
        return cls(blocks)                                        # type: ignore[arg-type]

    @staticmethod
    def supports(x: Tensor, k_caches: list[Tensor], v_caches: list[Tensor], keys) -> bool:
        """NativeBlock.supports for every layer's cache."""
        return all(NativeBlock.supports(x, k, keys, v) for k, v in zip(k_caches, v_caches, strict=True))

    def run(self, x: Tensor, cos: Tensor, sin: Tensor, q_cos: Tensor, q_sin: Tensor, k_caches: list[Tensor],
            v_caches: list[Tensor], at: int | Tensor, keys, start: int = 0, stop: int | None = None) -> Tensor:
        """x [S, D] -> the residual stream after blocks start .. stop - 1 [S, D] (x itself is not modified);
        cos/sin [S, 1, Dh] (keys), q_cos/q_sin the same with the query scale folded in; k_caches/v_caches:
        every block's cache [Hkv, C, Dh]; at: the rows' cache slots, l0 for [l0, l0 + S) or an int64 [S]
        tensor of slots (rows of several sequences); keys: kernels.attention.Plan."""
        stop = len(self.blocks) if stop is None else stop
        s, d = x.shape
        out = x.contiguous().clone()
        if stop <= start:
            return out
        table = torch.tensor([(*self._static[i], k_caches[i].data_ptr(), v_caches[i].data_ptr(), *self._qk[i])
                              for i in range(start, stop)], dtype=torch.int64)           # [n, 7]
        cos, sin, q_cos, q_sin = (t.contiguous() for t in (cos, sin, q_cos, q_sin))
        if isinstance(at, Tensor):
            slots = at.to(torch.int64).contiguous()                  # [S]
            if slots.shape != (s,):
                raise ValueError(f"the rows' cache slots must be [S={s}], got {tuple(slots.shape)}")
            l0, dst = 0, slots.data_ptr()
        else:
            l0, dst = at, None
        rc = self._fn(out.data_ptr(), s, d, stop - start, table.data_ptr(), self.eps, cos.data_ptr(),
                      sin.data_ptr(), q_cos.data_ptr(), q_sin.data_ptr(), self.h, self.hkv, self.dh,
                      k_caches[start].shape[1], KV_FORMATS[k_caches[start].dtype], l0, dst, *keys.args,
                      torch.get_num_threads())
        if rc == -1:
            raise MemoryError(f"the compiled blocks could not allocate scratch for S={s}")
        if rc == -2:
            raise ValueError("attention key plan is invalid for this cache: every row needs at least one key "
                             "inside the cache")
        if rc != 0:
            raise ValueError(f"the compiled blocks got shapes that do not fit, or rows outside the cache (S={s}, D={d}, "
                             f"at={at}, cache {tuple(k_caches[start].shape)})")
        return out
