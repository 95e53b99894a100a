"""Batch-invariant linear backends: the integer ones "q8", "q8b", "q8bm", "q40", "q50", "q80", "q6", "q4", "mixed",
"q4mix" (compiled kernels), "q8_torch", "q8b_torch", "q8bm_torch", "q40_torch", "q50_torch", "q80_torch", "q6_torch",
"q4_torch", and the float
ones "f32", "f16", "bf16w" (compiled kernels).

All of them quantize activations per block of a row (sa = amax / 127 over the block, round half to even;
ABLOCK = 256 inputs for q4 and q8, 32 for q8b, q8bm, q40, q50, q80 and q6), accumulate integer products exactly
and apply fp32 scales in one fixed order, so row i of an S-row forward is bit-identical to the 1-row forward of row i. The torch
backends read the same packed tensors as their compiled twins and reproduce them bit for bit (the tests
hold them to it): "q8_torch" (torch._int_mm) is the fallback where no compiler exists; "q4_torch",
"q8b_torch", "q8bm_torch", "q40_torch", "q50_torch", "q80_torch" and "q6_torch" are slow, memory-hungry oracles
(4 bytes per weight at build).
The float formats (f32, f16, bf16: pack_float.py, cpu_float.h) keep the weight's own float values and fp32
activations; each output is one dot product in one fixed order (16 lanes of fused multiply-adds, a fixed
tree), so they are batch-invariant too, with the scalar build as their reference (no torch twin: torch
has no fused multiply-add chain to mirror it with).
This module must never change the numerics of one backend without changing its twin.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from speczoo.kernels import native
from speczoo.kernels.linear import LinearBackend
from speczoo.kernels.pack import (ABLOCK, GROUP, STRIP, SUPER, check_packed, compact_q4, join_rows, pack_q4,
                                  pack_q8, unpack_q4, unpack_q8)
from speczoo.kernels.pack_float import FLOAT_DTYPES, FLOAT_KALIGN, GROUPS, float_part, pack_float
from speczoo.kernels.pack_q6 import pack_q6, unpack_q6
from speczoo.kernels.pack_q40 import pack_q40, unpack_q40
from speczoo.kernels.pack_q50 import pack_q50, unpack_q50
from speczoo.kernels.pack_q80 import pack_q80, unpack_q80
from speczoo.kernels.pack_q8b import Q8B_GROUP, Q8bCodes, pack_q8b, pack_q8bm, unpack_q8b

Q8_PARTS = ("w8", "sw", "meta")
Q4_PARTS = ("qs", "sc", "mn", "dd", "meta")
Q8B_PARTS = ("w8", "sb", "meta")
Q8BM_PARTS = ("w8", "sb", "mb", "meta")
Q6_PARTS = ("ql", "qh", "sc", "dd", "meta")
Q40_PARTS = ("qs", "sd", "meta")
Q50_PARTS = ("qs", "qh", "sd", "meta")
Q80_PARTS = ("w8", "sd", "meta")


def _as_rows(x: Tensor, k: int, who: str) -> Tensor:
    """x [..., K] fp32 -> x [S, K] with unit column stride (a view when possible)."""
    if x.dtype != torch.float32:
        raise TypeError(f"{who} takes fp32 activations, got {x.dtype}; convert with .float() first")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{who} expects x[..., {k}], got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, k)
    if x2.shape[0] > 0 and (x2.stride(1) != 1 or x2.stride(0) < k):
        x2 = x2.contiguous()
    return x2


def _is_plain(x: Tensor, k: int) -> bool:
    """x is already [S, K] fp32 with unit column stride (the fast path: no copy, no reshape)."""
    return x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1 and x.stride(0) >= k


def _check_bias(bias: Tensor | None, n: int) -> Tensor | None:
    if bias is None:
        return None
    if bias.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    return bias.detach().float().contiguous()


def quantize_blocks(x: Tensor, block: int = ABLOCK) -> tuple[Tensor, Tensor]:
    """int8 activations exactly as the kernels make them, one scale per block of `block` inputs of a row (the
    last block may be shorter): xq int8 [S, K], sa fp32 [S, KB] with KB = ceil(K / block)."""
    s, k = x.shape
    kb = -(-k // block)
    xp = torch.zeros(s, kb * block, dtype=torch.float32)
    xp[:, :k] = x
    xb = xp.view(s, kb, block)                                   # [S, KB, block]
    sa = xb.abs().amax(dim=2) / 127.0                            # [S, KB]
    safe = torch.where(sa > 0, sa, torch.ones_like(sa))[:, :, None]
    xq = torch.round(xb / safe).clamp_(-127, 127)
    xq = torch.where(sa[:, :, None] > 0, xq, torch.zeros_like(xq)).to(torch.int8)
    return xq.view(s, kb * block)[:, :k], sa


# ---------------------------------------------------------------------------------- compiled
class Q8Native(nn.Module):
    """int8 weights (per-column scale) x int8 activations (a scale per block of a row), compiled kernel (per-ISA
    paths, bit-identical)."""

    fmt, parts, scale = "q8", Q8_PARTS, "sw"

    def __init__(self, packed: dict[str, Tensor], bias: Tensor | None, lib: native.NativeKernels):
        super().__init__()
        self.n, self.k = check_packed(packed, self.parts, self.fmt)
        self.w8 = packed["w8"].contiguous()        # [NB, KP/4, 16, 4] u8
        setattr(self, self.scale, packed[self.scale].float().contiguous())   # q8: sw [NB*16]; q8b: sb [NB, KP/16, 16]
        self.bias = _check_bias(bias, self.n)
        self.lib = lib
        self._fn = getattr(lib, f"{self.fmt}_fn")
        self._args = (self.w8.data_ptr(), getattr(self, self.scale).data_ptr(), self.n,
                      None if self.bias is None else self.bias.data_ptr())

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        x2 = x if _is_plain(x, self.k) else _as_rows(x, self.k, f"{self.fmt} linear")
        s = x2.shape[0]
        y = torch.empty(s, self.n)                 # [S, N] fp32
        if s and self._fn(x2.data_ptr(), s, self.k, x2.stride(0), *self._args, y.data_ptr(), torch.get_num_threads()):
            raise MemoryError(f"{self.fmt} kernel could not allocate its scratch for S={s}, K={self.k}")
        return y if x2 is x else y.view(*x.shape[:-1], self.n)


class Q8bNative(Q8Native):
    """int8 weights with a scale per 16 inputs (pack_q8b.py) x int8 activations with a scale per 32 inputs of
    a row, compiled kernel (per-ISA paths, bit-identical)."""

    fmt, parts, scale = "q8b", Q8B_PARTS, "sb"


class Q8bmNative(nn.Module):
    """q8b's weights plus an fp32 offset per 32 inputs (pack_q8b.py: Q4_1, Q5_1, Q5_K) x int8 activations with
    a scale per 32 inputs of a row, compiled kernel (per-ISA paths, bit-identical)."""

    def __init__(self, packed: dict[str, Tensor], bias: Tensor | None, lib: native.NativeKernels):
        super().__init__()
        self.n, self.k = check_packed(packed, Q8BM_PARTS, "q8bm")
        self.w8 = packed["w8"].contiguous()        # [NB, KP/4, 16, 4] u8
        self.sb = packed["sb"].float().contiguous()  # [NB, KP/16, 16] f32
        self.mb = packed["mb"].float().contiguous()  # [NB, KP/32, 16] f32
        self.bias = _check_bias(bias, self.n)
        self.lib = lib
        self._fn = lib.q8bm_fn
        self._args = (self.w8.data_ptr(), self.sb.data_ptr(), self.mb.data_ptr(), self.n,
                      None if self.bias is None else self.bias.data_ptr())

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        x2 = x if _is_plain(x, self.k) else _as_rows(x, self.k, "q8bm linear")
        s = x2.shape[0]
        y = torch.empty(s, self.n)                 # [S, N] fp32
        if s and self._fn(x2.data_ptr(), s, self.k, x2.stride(0), *self._args, y.data_ptr(), torch.get_num_threads()):
            raise MemoryError(f"q8bm kernel could not allocate its scratch for S={s}, K={self.k}")
        return y if x2 is x else y.view(*x.shape[:-1], self.n)


class Q4Native(nn.Module):
    """4-bit super-block weights x int8 activations (a scale per super-block of a row), compiled kernel (per-ISA
    paths, bit-identical)."""

    def __init__(self, packed: dict[str, Tensor], bias: Tensor | None, lib: native.NativeKernels):
        super().__init__()
        self.n, self.k = check_packed(packed, Q4_PARTS, "q4")
        packed = compact_q4(packed)                # G = q4_groups(K) groups of 32, KB = ceil(G / 8)
        self.qs = packed["qs"].contiguous()        # [NB, G, 4, 16, 4] u8
        self.sc = packed["sc"].contiguous()        # [NB, G, 16] u8
        self.mn = packed["mn"].contiguous()        # [NB, G/2, 16, 2] u8
        self.dd = packed["dd"].float().contiguous()  # [NB, KB, 2, 16] f32
        self.bias = _check_bias(bias, self.n)
        self.lib = lib
        self._fn = lib.q4_fn
        self._args = (self.qs.data_ptr(), self.sc.data_ptr(), self.mn.data_ptr(), self.dd.data_ptr(), self.n,
                      None if self.bias is None else self.bias.data_ptr())

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        x2 = x if _is_plain(x, self.k) else _as_rows(x, self.k, "q4 linear")
        s = x2.shape[0]
        y = torch.empty(s, self.n)                 # [S, N] fp32
        if s and self._fn(x2.data_ptr(), s, self.k, x2.stride(0), *self._args, y.data_ptr(), torch.get_num_threads()):
            raise MemoryError(f"q4 kernel could not allocate its scratch for S={s}, K={self.k}")
        return y if x2 is x else y.view(*x.shape[:-1], self.n)


class Q40Native(nn.Module):
    """4-bit codes with an fp16 scale per 32 inputs (pack_q40.py: Q4_0 in its own bytes) x int8 activations
    with a scale per 32 inputs of a row, compiled kernel (per-ISA paths, bit-identical; every column equal
    to its q8b twin's). Q50Native and Q80Native are the same with Q5_0's and Q8_0's codes."""

    fmt, parts = "q40", Q40_PARTS                  # the code parts, then "sd" and "meta"

    def __init__(self, packed: dict[str, Tensor], bias: Tensor | None, lib: native.NativeKernels):
        super().__init__()
        self.n, self.k = check_packed(packed, self.parts, self.fmt)
        for part in self.parts[:-2]:               # q40, q50: qs [NB, KP/32, 4, 16, 4] u8; q50 also qh
            setattr(self, part, packed[part].contiguous())   # [NB, KP/32, 16, 4] u8; q80: w8 [NB, KP/4, 16, 4] u8
        self.sd = packed["sd"].contiguous()        # [NB, KP/32, 16] f16, as stored (no fp32 copy)
        if self.sd.dtype != torch.float16:
            raise ValueError(f"packed {self.fmt} scales must be float16, got {self.sd.dtype}; re-pull the model "
                             "(speczoo pull NAME --force)")
        self.bias = _check_bias(bias, self.n)
        self.lib = lib
        self._fn = getattr(lib, f"{self.fmt}_fn")
        self._args = (*(getattr(self, part).data_ptr() for part in self.parts[:-1]), self.n,
                      None if self.bias is None else self.bias.data_ptr())

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        x2 = x if _is_plain(x, self.k) else _as_rows(x, self.k, f"{self.fmt} linear")
        s = x2.shape[0]
        y = torch.empty(s, self.n)                 # [S, N] fp32
        if s and self._fn(x2.data_ptr(), s, self.k, x2.stride(0), *self._args, y.data_ptr(), torch.get_num_threads()):
            raise MemoryError(f"{self.fmt} kernel could not allocate its scratch for S={s}, K={self.k}")
        return y if x2 is x else y.view(*x.shape[:-1], self.n)


class Q50Native(Q40Native):
    """Q5_0 in its own 5.5 bits (pack_q50.py): q40's kernel with a fifth bit per code."""

    fmt, parts = "q50", Q50_PARTS


class Q80Native(Q40Native):
    """Q8_0 in its own 8.5 bits (pack_q80.py): q8b's codes with q40's fp16 scale per 32."""

    fmt, parts = "q80", Q80_PARTS


class Q6Native(nn.Module):
    """6-bit weights with int8 sub-scales per 16 inputs and an fp32 scale per 256 (pack_q6.py: Q6_K) x int8
    activations with a scale per 32 inputs of a row, compiled kernel (per-ISA paths, bit-identical; every
    column equal to its q8b twin's)."""

    def __init__(self, packed: dict[str, Tensor], bias: Tensor | None, lib: native.NativeKernels):
        super().__init__()
        self.n, self.k = check_packed(packed, Q6_PARTS, "q6")
        self.ql = packed["ql"].contiguous()        # [NB, KP/32, 4, 16, 4] u8
        self.qh = packed["qh"].contiguous()        # [NB, KP/32, 2, 16, 4] u8
        self.sc = packed["sc"].contiguous()        # [NB, KP/16, 16] i8
        self.dd = packed["dd"].float().contiguous()  # [NB, KB, 16] f32
        self.bias = _check_bias(bias, self.n)
        self.lib = lib
        self._fn = lib.q6_fn
        self._args = (self.ql.data_ptr(), self.qh.data_ptr(), self.sc.data_ptr(), self.dd.data_ptr(), self.n,
                      None if self.bias is None else self.bias.data_ptr())

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        x2 = x if _is_plain(x, self.k) else _as_rows(x, self.k, "q6 linear")
        s = x2.shape[0]
        y = torch.empty(s, self.n)                 # [S, N] fp32
        if s and self._fn(x2.data_ptr(), s, self.k, x2.stride(0), *self._args, y.data_ptr(), torch.get_num_threads()):
            raise MemoryError(f"q6 kernel could not allocate its scratch for S={s}, K={self.k}")
        return y if x2 is x else y.view(*x.shape[:-1], self.n)


class FloatNative(nn.Module):
    """Float weights (fp32, fp16 or bf16 values: pack_float.py) x fp32 activations, compiled kernel
    (cpu_float.h: one fixed-order dot product per output; per-ISA paths, bit-identical; nothing quantized)."""

    fmt = ""
    code = -1                                      # the kernel's format number (cpu_kernels.h SZ_FMT_*)

    def __init__(self, packed: dict[str, Tensor], bias: Tensor | None, lib: native.NativeKernels):
        super().__init__()
        self.part = float_part(self.fmt)
        self.n, self.k = check_packed(packed, (self.part, "meta"), self.fmt)
        w = packed[self.part]
        nb, kc = -(-self.n // STRIP), -(-self.k // FLOAT_KALIGN)
        if w.dtype != FLOAT_DTYPES[self.fmt] or tuple(w.shape) != (nb, GROUPS, kc, STRIP // GROUPS, FLOAT_KALIGN):
            raise ValueError(f"packed {self.fmt} weight must be [{nb}, 4, {kc}, 4, {FLOAT_KALIGN}] "
                             f"{FLOAT_DTYPES[self.fmt]}, got {tuple(w.shape)} {w.dtype}; re-pull the model "
                             "(speczoo pull NAME --force)")
        setattr(self, self.part, w.contiguous())   # [NB, 4, KP/16, 4, 16]
        self.bias = _check_bias(bias, self.n)
        self.lib = lib
        self._fn = lib.float_fn
        self._w = getattr(self, self.part)
        self._bias_ptr = None if self.bias is None else self.bias.data_ptr()

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        x2 = x if _is_plain(x, self.k) else _as_rows(x, self.k, f"{self.fmt} linear")
        s = x2.shape[0]
        y = torch.empty(s, self.n)                 # [S, N] fp32
        if s and self._fn(self.code, x2.data_ptr(), s, self.k, x2.stride(0), self._w.data_ptr(), self.n,
                          self._bias_ptr, y.data_ptr(), torch.get_num_threads()):
            raise MemoryError(f"{self.fmt} kernel could not allocate its workspace for S={s}, K={self.k}")
        return y if x2 is x else y.view(*x.shape[:-1], self.n)


class F32Native(FloatNative):
    fmt, code = "f32", 4


class F16Native(FloatNative):
    fmt, code = "f16", 5


class Bf16Native(FloatNative):
    fmt, code = "bf16", 6


# The packed parts of each compiled format, every one laid out by 16-column strips along its first dim.
_STRIP_PARTS: dict[type, tuple[str, ...]] = {Q4Native: ("qs", "sc", "mn", "dd"), Q8Native: ("w8", "sw"),
                                             Q8bNative: ("w8", "sb"), Q8bmNative: ("w8", "sb", "mb"),
                                             Q6Native: ("ql", "qh", "sc", "dd"),
                                             **{c: c.parts[:-1] for c in (Q40Native, Q50Native, Q80Native)},
                                             **{c: (float_part(c.fmt),) for c in (F32Native, F16Native, Bf16Native)}}
# The compiled kernel formats a weight may be stored in, by name. A bundle of the "mixed" backend holds each
# weight in one of these, recognised at build by its parts.
KERNEL_FORMATS: dict[str, type[nn.Module]] = {"q4": Q4Native, "q8": Q8Native, "q8b": Q8bNative, "q8bm": Q8bmNative,
                                              "q6": Q6Native, "q40": Q40Native, "q50": Q50Native, "q80": Q80Native,
                                              "f32": F32Native, "f16": F16Native, "bf16": Bf16Native}
# The activation block each integer format's kernel quantizes x by (one int8 scale per this many inputs of a
# row). The float formats quantize no activation and have no entry.
ACT_BLOCK: dict[str, int] = {"q4": ABLOCK, "q8": ABLOCK, "q8b": 2 * Q8B_GROUP, "q8bm": 2 * Q8B_GROUP,
                             "q6": 2 * Q8B_GROUP, "q40": 2 * Q8B_GROUP, "q50": 2 * Q8B_GROUP, "q80": 2 * Q8B_GROUP}


def kernel_format(packed: dict[str, Tensor]) -> str:
    """The name of the kernel format whose parts `packed` holds (an error naming the known ones if none)."""
    for name, cls in KERNEL_FORMATS.items():
        if set(packed) == {*_STRIP_PARTS[cls], "meta"}:
            return name
    raise ValueError(f"packed weight parts {sorted(packed)} are no compiled format's "
                     f"({ {n: list(_STRIP_PARTS[c]) for n, c in KERNEL_FORMATS.items()} }); re-pull the model "
                     "(speczoo pull NAME --force)")


def build_compiled(packed: dict[str, Tensor], bias: Tensor | None, lib: native.NativeKernels) -> nn.Module:
    """The compiled module of whichever format `packed` holds, told by its parts (a bundle may pack each
    tensor in the format that holds its GGUF type: q4, q6, q40, q50, q80, q8b, q8bm, q8, f32, f16, bf16)."""
    return KERNEL_FORMATS[kernel_format(packed)](packed, bias, lib)


def is_compiled(mod: nn.Module) -> bool:
    """Whether `mod` is one of the compiled linears (a call into the kernel library)."""
    return type(mod) in _STRIP_PARTS


def joinable(mods: list[nn.Module]) -> bool:
    """Whether `mods` can share one compiled call (concat_native): all of one compiled format, one K, every N
    a multiple of the 16-column strip, and bias on all or on none."""
    return (len(mods) >= 1 and all(type(m) is type(mods[0]) for m in mods) and is_compiled(mods[0])
            and all(m.k == mods[0].k and m.n % STRIP == 0 for m in mods) and len({m.bias is None for m in mods}) == 1)


def concat_native(mods: list[nn.Module]) -> nn.Module | None:
    """One compiled module computing the outputs of `mods` side by side ([S, sum N]), or None when there are
    fewer than two or they cannot share one call (`joinable`). Each output column is computed exactly as
    before (the activation quantization does not depend on N), so the fused result is bit-identical. Each
    packed part is a view of the modules' memory when theirs lie end to end (`join_rows`: a bundle stores
    them so), else a copy."""
    if len(mods) < 2 or not joinable(mods):
        return None
    n = sum(m.n for m in mods)
    bias = None if mods[0].bias is None else torch.cat([m.bias for m in mods])
    meta = torch.tensor([n, mods[0].k], dtype=torch.int64)
    packed = {name: join_rows([getattr(m, name) for m in mods]) for name in _STRIP_PARTS[type(mods[0])]}
    packed["meta"] = meta
    return type(mods[0])(packed, bias, mods[0].lib)


def select_strips(mod: nn.Module, strips: Tensor) -> nn.Module | None:
    """A compiled linear computing only the outputs of the given 16-column strips of `mod` (strip b =
    outputs 16b .. 16b + 15, in the order given), each column exactly as `mod` computes it. A leading
    range of strips shares `mod`'s memory; any other selection copies just those strips. None when `mod`
    is not a compiled kernel."""
    if type(mod) not in _STRIP_PARTS:
        return None
    nb_all = -(-mod.n // STRIP)
    strips = strips.to(torch.long)
    if strips.numel() == 0 or int(strips.min()) < 0 or int(strips.max()) >= nb_all:
        raise ValueError(f"strips must be non-empty and within 0..{nb_all - 1}")
    nb = strips.numel()
    leading = bool(torch.equal(strips, torch.arange(nb)))
    pick = (lambda t: t[:nb]) if leading else (lambda t: t.index_select(0, strips))
    cols = (strips[:, None] * STRIP + torch.arange(STRIP)).flatten()                 # [nb * 16]
    n = nb * STRIP
    if bool((strips * STRIP + STRIP > mod.n).any()):
        raise ValueError(f"strip selection reaches past the {mod.n} outputs (the last strip is partial)")
    bias = None if mod.bias is None else mod.bias[cols]
    meta = torch.tensor([n, mod.k], dtype=torch.int64)
    packed = {name: pick(getattr(mod, name)) for name in _STRIP_PARTS[type(mod)]}
    if type(mod) is Q8Native:
        packed["sw"] = mod.sw[cols]                                                  # one scale per column, flat
    packed["meta"] = meta
    return type(mod)(packed, bias, mod.lib)


# ---------------------------------------------------------------------------------- pure torch
class Q8Torch(nn.Module):
    """torch._int_mm twin of Q8Native: F = sum_b (float)(xq_b @ q_b^T) * sa_b over the activation blocks b,
    in order from 0; y = F * sw (+ bias)."""

    def __init__(self, packed: dict[str, Tensor], bias: Tensor | None):
        super().__init__()
        self.n, self.k = check_packed(packed, Q8_PARTS, "q8")
        q, self.sw = unpack_q8(packed)               # q: [N, K] int8, sw: [N]
        self.qt = q.t().contiguous()                 # [K, N] int8
        self.bias = _check_bias(bias, self.n)

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        x2 = _as_rows(x, self.k, "q8_torch linear")
        s = x2.shape[0]
        xq, sa = quantize_blocks(x2)                 # [S, K] int8, [S, KB]
        f = torch.zeros(s, self.n, dtype=torch.float32)
        for b in range(sa.shape[1]):
            k0, k1 = b * ABLOCK, min(self.k, (b + 1) * ABLOCK)
            acc = torch._int_mm(xq[:, k0:k1], self.qt[k0:k1]) if s else torch.zeros(0, self.n, dtype=torch.int32)
            f = f + acc.float() * sa[:, b:b + 1]
        y = f * self.sw[None, :]                     # [S, N]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.n)


class Q8bTorch(nn.Module):
    """Reference twin of Q8bNative: per group g of 32 inputs (halves 2g, 2g + 1 with their scales a),
    F += ((float)t_2g * a_2g + (float)t_2g+1 * a_2g+1) * sa_g, g in order from 0; y = F (+ bias)."""

    def __init__(self, packed: dict[str, Tensor], bias: Tensor | None):
        super().__init__()
        c = self._codes(packed)
        self.kp = c.q.shape[1]
        self.q = c.q.view(self.n, -1, Q8B_GROUP).permute(1, 2, 0).float().contiguous()   # [KP/16, 16, N]
        self.a = c.a.t().contiguous()                                                     # [KP/16, N]
        self.m = None if c.m is None else c.m.t().contiguous()                            # [KP/32, N] (q8bm)
        self.bias = _check_bias(bias, self.n)

    def _codes(self, packed: dict[str, Tensor]) -> Q8bCodes:
        self.n, self.k = check_packed(packed, Q8B_PARTS, "q8b")
        return unpack_q8b(packed)

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        x2 = _as_rows(x, self.k, "q8b_torch linear")
        s = x2.shape[0]
        xq, sa = quantize_blocks(x2, 2 * Q8B_GROUP)                 # [S, K] int8, [S, KP/32]
        xp = torch.zeros(s, self.kp, dtype=torch.float32)
        xp[:, : self.k] = xq.float()
        t = torch.bmm(xp.view(s, self.kp // Q8B_GROUP, Q8B_GROUP).transpose(0, 1), self.q)   # [KP/16, S, N], exact
        m = t * self.a[:, None, :]
        u = m[0::2] + m[1::2]                                         # [KP/32, S, N]
        if self.m is not None:                                        # q8bm: + (float)xs_g * m_g
            xs = xp.view(s, self.kp // (2 * Q8B_GROUP), 2 * Q8B_GROUP).sum(-1).t()   # [KP/32, S], exact
            u = u + xs[:, :, None] * self.m[:, None, :]
        v = u * sa.t()[:, :, None]
        y = torch.zeros(s, self.n, dtype=torch.float32)
        for g in range(v.shape[0]):
            y = y + v[g]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.n)


class Q8bmTorch(Q8bTorch):
    """Reference twin of Q8bmNative: q8b's per group, with (float)xs_g * m_g added before the activation scale,
    F += (((float)t_2g * a_2g + (float)t_2g+1 * a_2g+1) + (float)xs_g * m_g) * sa_g."""

    def _codes(self, packed: dict[str, Tensor]) -> Q8bCodes:
        self.n, self.k = check_packed(packed, Q8BM_PARTS, "q8bm")
        return unpack_q8b(packed)


class Q6Torch(Q8bTorch):
    """Reference twin of Q6Native: its q8b twin's arithmetic on the same codes and scales (D * sc)."""

    def _codes(self, packed: dict[str, Tensor]) -> Q8bCodes:
        self.n, self.k = check_packed(packed, Q6_PARTS, "q6")
        return unpack_q6(packed).q8b()


class Q40Torch(Q8bTorch):
    """Reference twin of Q40Native: its q8b twin's arithmetic on the same codes and scales (d per half).
    Q50Torch and Q80Torch are the same for Q50Native and Q80Native."""

    fmt, parts, unpack = "q40", Q40_PARTS, staticmethod(unpack_q40)

    def _codes(self, packed: dict[str, Tensor]) -> Q8bCodes:
        self.n, self.k = check_packed(packed, self.parts, self.fmt)
        return self.unpack(packed).q8b()


class Q50Torch(Q40Torch):
    fmt, parts, unpack = "q50", Q50_PARTS, staticmethod(unpack_q50)


class Q80Torch(Q40Torch):
    fmt, parts, unpack = "q80", Q80_PARTS, staticmethod(unpack_q80)


class Q4Torch(nn.Module):
    """Reference twin of Q4Native (exact integer group sums in fp32, then the kernel's fp32 order)."""

    def __init__(self, packed: dict[str, Tensor], bias: Tensor | None):
        super().__init__()
        self.n, self.k = check_packed(packed, Q4_PARTS, "q4")
        c = unpack_q4(packed)
        self.kp = c.q.shape[1]
        g = self.kp // GROUP
        self.q = c.q.view(self.n, g, GROUP).permute(1, 2, 0).float().contiguous()  # [G, 32, N]
        self.sc = c.sc.t().to(torch.int64).contiguous()                             # [G, N]
        self.m = c.m.t().to(torch.int64).contiguous()                               # [G, N]
        self.d, self.dm = c.d, c.dm                                                 # [N, KB]
        self.bias = _check_bias(bias, self.n)

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        x2 = _as_rows(x, self.k, "q4_torch linear")
        s, g, kb = x2.shape[0], self.kp // GROUP, self.kp // SUPER
        xq, sa = quantize_blocks(x2)                                 # [S, K] int8, [S, KB]
        xp = torch.zeros(s, self.kp, dtype=torch.float32)
        xp[:, : self.k] = xq.float()
        xg = xp.view(s, g, GROUP).transpose(0, 1)                    # [G, S, 32]
        t = torch.bmm(xg, self.q).to(torch.int64)                    # [G, S, N], exact (< 2^24)
        isb = (t * self.sc[:, None, :]).view(kb, 8, s, self.n).sum(1)              # [KB, S, N]
        xs = xg.sum(-1).to(torch.int64)                                             # [G, S]
        imn = (xs[:, :, None] * self.m[:, None, :]).view(kb, 8, s, self.n).sum(1)  # [KB, S, N]
        y = torch.zeros(s, self.n, dtype=torch.float32)
        for b in range(sa.shape[1]):                                 # the blocks past q4_groups(K) add nothing
            t = isb[b].float() * self.d[None, :, b] - imn[b].float() * self.dm[None, :, b]
            y = y + t * sa[:, b:b + 1]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.n)


# ---------------------------------------------------------------------------------- backends
class Q8Backend(LinearBackend):
    name = "q8"
    stored = True
    cheap_pack = True
    batch_invariant = True

    def __init__(self, path: native.KernelPath | None = None):
        self.path = path  # None: the path chosen for this CPU

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_q8(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Q8Native(packed, bias, native.kernels(self.path))


class Q4Backend(LinearBackend):
    name = "q4"
    stored = True
    batch_invariant = True

    def __init__(self, path: native.KernelPath | None = None):
        self.path = path  # None: the path chosen for this CPU

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_q4(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Q4Native(packed, bias, native.kernels(self.path))


class Q8TorchBackend(LinearBackend):
    name = "q8_torch"
    stored = True
    cheap_pack = True
    batch_invariant = True

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_q8(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Q8Torch(packed, bias)


class Q4TorchBackend(LinearBackend):
    name = "q4_torch"
    stored = True
    batch_invariant = True

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_q4(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Q4Torch(packed, bias)


class MixedBackend(LinearBackend):
    """Each weight in its own compiled kernel format, chosen at pull time and read back from its parts.

    The pull picks the format of each weight from its source's type (zoo/policy.py: the format that holds
    it exactly, else the nearest above it) and stores that packing; build() reads which format from the
    parts (build_compiled). pack() of a bare fp32 weight, which no file's type names (an EAGLE head packed
    at load, a model built in memory), packs q8b, the finest integer grid, not the table's F32 row (f32):
    a head only proposes tokens, which the target verifies, so its precision never reaches the output,
    while its bytes set the draft step's time (f32 streams four times q8b's).
    """

    name = "mixed"
    stored = True
    batch_invariant = True

    def __init__(self, path: native.KernelPath | None = None):
        self.path = path  # None: the path chosen for this CPU

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_q8b(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return build_compiled(packed, bias, native.kernels(self.path))


class Q8bBackend(LinearBackend):
    """q8b (pack_q8b.py): a GGUF's Q8_0 / Q6_K / Q5_0 / Q4_0 tensors exactly, when packed from their blocks
    (pack_q8b_gguf); `pack` here quantizes an fp32 weight with a scale per 16 inputs."""

    name = "q8b"
    stored = True
    # not cheap: a tied head is stored at pull time, where the policy packs it exactly from the GGUF's blocks
    # (packed at load from the decoded embedding, pack_q8b would requantize a Q8_0 head, not hold it)
    batch_invariant = True

    def __init__(self, path: native.KernelPath | None = None):
        self.path = path

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_q8b(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Q8bNative(packed, bias, native.kernels(self.path))


class Q8bTorchBackend(LinearBackend):
    name = "q8b_torch"
    stored = True
    batch_invariant = True

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_q8b(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Q8bTorch(packed, bias)


class _TwinnedBackend(LinearBackend):
    """A compiled integer format whose torch twin is one flag away: `pack` quantizes an fp32 weight with the
    format's packer (_pack), `build` gives its compiled kernel (_native), or with twin=True its torch twin
    (_torch), named "<name>_torch"."""

    stored = True
    batch_invariant = True
    _pack: Callable[[Tensor], dict[str, Tensor]]
    _native: type[nn.Module]
    _torch: type[nn.Module]

    def __init__(self, path: native.KernelPath | None = None, twin: bool = False):
        self.path, self.twin = path, twin
        self.name = f"{type(self).name}_torch" if twin else type(self).name

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return type(self)._pack(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return self._torch(packed, bias) if self.twin else self._native(packed, bias, native.kernels(self.path))


class Q8bmBackend(_TwinnedBackend):
    """q8bm (pack_q8b.py): a GGUF's Q4_1 / Q5_1 / Q5_K tensors exactly, when the pull packs them from their
    blocks; `pack` here quantizes an fp32 weight with an offset per 32 (the middle of its range) and q8b's
    codes of the rest (quantize_q8bm). twin: the torch twin "q8bm_torch" instead of the compiled kernel."""

    name = "q8bm"
    _pack, _native, _torch = staticmethod(pack_q8bm), Q8bmNative, Q8bmTorch


class Q6Backend(LinearBackend):
    """q6 (pack_q6.py): a GGUF's Q6_K tensors exactly, when packed from their blocks (pack_q6_gguf); `pack`
    here quantizes an fp32 weight on q6's grid."""

    name = "q6"
    stored = True
    batch_invariant = True

    def __init__(self, path: native.KernelPath | None = None):
        self.path = path

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_q6(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Q6Native(packed, bias, native.kernels(self.path))


class Q40Backend(_TwinnedBackend):
    """q40 (pack_q40.py): a GGUF's Q4_0 tensors in their own bytes, when packed from their blocks
    (pack_q40_gguf); `pack` here quantizes an fp32 weight as llama.cpp's Q4_0 quantizer does. twin: the torch
    twin "q40_torch" instead of the compiled kernel."""

    name = "q40"
    _pack, _native, _torch = staticmethod(pack_q40), Q40Native, Q40Torch


class Q50Backend(_TwinnedBackend):
    """q50 (pack_q50.py): a GGUF's Q5_0 tensors in their own bits, when packed from their blocks
    (pack_q50_gguf); `pack` here quantizes an fp32 weight as llama.cpp's Q5_0 quantizer does. twin: the torch
    twin "q50_torch" instead of the compiled kernel."""

    name = "q50"
    _pack, _native, _torch = staticmethod(pack_q50), Q50Native, Q50Torch


class Q80Backend(_TwinnedBackend):
    """q80 (pack_q80.py): a GGUF's Q8_0 tensors in their own bytes, when packed from their blocks
    (pack_q80_gguf); `pack` here quantizes an fp32 weight as llama.cpp's Q8_0 quantizer does. twin: the torch
    twin "q80_torch" instead of the compiled kernel."""

    name = "q80"
    _pack, _native, _torch = staticmethod(pack_q80), Q80Native, Q80Torch


class Q6TorchBackend(LinearBackend):
    name = "q6_torch"
    stored = True
    batch_invariant = True

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_q6(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Q6Torch(packed, bias)


class FloatBackend(LinearBackend):
    """A float format (pack_float.py): "f32", "f16", and "bf16w" for the bf16 format ("bf16" names the older
    torch backend of kernels/linear.py, bf16 activations included). The pull packs a GGUF's F32 / F16 / BF16
    tensors so under "mixed" (zoo/policy.py); `pack` here rounds any fp32 weight to the element type."""

    stored = True
    cheap_pack = True
    batch_invariant = True

    def __init__(self, fmt: str, path: native.KernelPath | None = None, name: str | None = None):
        self.fmt, self.path, self.name = fmt, path, name or fmt   # path None: the path chosen for this CPU

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return pack_float(weight, self.fmt)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return KERNEL_FORMATS[self.fmt](packed, bias, native.kernels(self.path))


class Q4MixBackend(LinearBackend):
    """q4 for weights that sit on a 4-bit grid (a Q4_K GGUF's tensors repack almost exactly), q8 for the rest.

    pack() quantizes to q4 and keeps it when its relative weight error is under `max_q4_error`, else packs
    q8 (a Q4_K_M file's Q6_K tensors: ~7.5% error at 4 bits, ~1.2% at 8). Superseded by "mixed", which
    chooses by the source's type without the search; kept so that its bundles load and re-pack the same.
    """

    name = "q4mix"
    stored = True
    batch_invariant = True

    def __init__(self, max_q4_error: float = 0.01, path: native.KernelPath | None = None):
        self.max_q4_error = max_q4_error
        self.path = path

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        packed = pack_q4(weight)
        w = weight.detach().float()
        deq = unpack_q4(packed).dequantize()[:, : w.shape[1]]
        err = ((deq - w).norm() / w.norm().clamp_min(1e-30)).item()
        return packed if err <= self.max_q4_error else pack_q8(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return build_compiled(packed, bias, native.kernels(self.path))
