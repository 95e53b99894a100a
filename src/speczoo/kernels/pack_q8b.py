"""The q8b format: int8 codes with one fp32 scale per 16 inputs, w[n, k] = a[n, k // 16] * q[n, k]; and q8bm,
the same plus one fp32 offset per 32 inputs, w[n, k] = a[n, k // 16] * q[n, k] + m[n, k // 32].

It holds llama.cpp's Q8_0, Q6_K, Q5_0 and Q4_0 exactly: their codes are integers in [-128, 127] and their
scales, per 32 inputs (an fp16 d) or per 16 (Q6_K: an fp16 d times an int8 sub-scale, 19 bits), are fp32
values (and Q3_K, whose codes and scales models/gguf_blocks.k_quant_codes reads). q8bm holds Q4_1 and Q5_1
exactly (w = d * q + m per 32 inputs, q in [0, 15] or [0, 31], d and m fp16), and Q5_K (k_quant_codes): the
kernel adds m times the group's activation sum, as llama.cpp's Q8_1 activations carry it.
`pack_q8b_gguf` reads those types' blocks as the file stores them (no search, no fp32 round trip);
`pack_q8b` quantizes any fp32 weight with one scale (amax / 127) per 16 inputs, 8 bits per weight, which is
above the precision of every GGUF type short of F16. The kernels (cpu_kernels.cpp, q8b) pair it with int8
activations of one scale per 32 inputs, as llama.cpp's Q8_0 activations.

Layout (the kernel's; NB = ceil(N / 16) strips of 16 output columns, KP = K rounded up to 32):
  w8 u8 [NB, KP/4, 16, 4] = q + 128, as q8's;  sb f32 [NB, KP/16, 16]: the scale of inputs 16j .. 16j + 15
  of each column (0 for padding);  q8bm also mb f32 [NB, KP/32, 16]: the offset of inputs 32g .. 32g + 31;
  meta i64 [N, K].
Deterministic, like every packer here: the same weight gives the same bytes. This module never runs a matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.kernels.pack import (STRIP, Q8_KALIGN, _check_shape, _check_finite, _meta, _round_up,
                                   padded_rows)

Q8B_GROUP = 16        # inputs per weight scale
Q8B_GGUF_TYPES = ("Q8_0", "Q6_K", "Q5_0", "Q4_0")     # the GGUF block types q8b holds exactly
Q8BM_GGUF_TYPES = ("Q4_1", "Q5_1")                    # ... and those q8bm holds exactly (an offset per 32)
_LEGACY_BYTES = {"Q8_0": 34, "Q5_0": 22, "Q4_0": 18, "Q4_1": 20, "Q5_1": 24}   # a block of 32 inputs
_ROW_CHUNK = 512      # rows pack_q8b quantizes at a time (its temporaries stay in cache)


@dataclass
class Q8bCodes:
    """q8b in plain order: w[n, k] = a[n, k // 16] * q[n, k] for k < K (KP = K rounded up to 32); q8bm when
    m is set: w[n, k] = a[n, k // 16] * q[n, k] + m[n, k // 32]."""

    q: Tensor    # [N, KP] int8
    a: Tensor    # [N, KP/16] fp32
    m: Tensor | None = None   # [N, KP/32] fp32, q8bm's offsets

    def dequantize(self) -> Tensor:  # -> [N, KP] fp32
        n, kp = self.q.shape
        w = (self.q.view(n, -1, Q8B_GROUP).float() * self.a[:, :, None]).view(n, kp)
        if self.m is None:
            return w
        return (w.view(n, -1, 2 * Q8B_GROUP) + self.m[:, :, None]).view(n, kp)


def quantize_q8b(weight: Tensor) -> Q8bCodes:
    """Any fp32 weight [N, K]: per 16 inputs a = amax / 127, q = round(w / a) (half to even) in [-127, 127]."""
    w = _check_shape(weight)
    n, k = w.shape
    kp = _round_up(k, Q8_KALIGN)
    q = torch.zeros(n, kp, dtype=torch.int8)
    a = torch.zeros(n, kp // Q8B_GROUP, dtype=torch.float32)
    for r0, r1, rows in padded_rows(w, kp, _ROW_CHUNK):
        g = rows.view(r1 - r0, -1, Q8B_GROUP)                               # [R, KP/16, 16]
        amax = g.abs().amax(-1)                                              # [R, KP/16]; NaN/inf propagate
        _check_finite(bool(torch.isfinite(amax).all()))
        scale = amax / 127.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))[:, :, None]
        q[r0:r1] = (g / safe).round_().clamp_(-127, 127).view(r1 - r0, kp).to(torch.int8)
        a[r0:r1] = scale
    return Q8bCodes(q=q, a=a)


def quantize_q8bm(weight: Tensor) -> Q8bCodes:
    """Any fp32 weight [N, K] in q8bm: per 32 inputs the offset m = the middle of their range, then q8b's
    codes of w - m (quantize_q8b). Not the way a GGUF's Q4_1 / Q5_1 come in (q8b_from_gguf holds them as
    they are): for weights packed in memory and for the tests, whose offsets must not all be 0."""
    w = _check_shape(weight)
    n, k = w.shape
    kp = _round_up(k, Q8_KALIGN)
    rows = torch.zeros(n, kp, dtype=torch.float32)
    rows[:, :k] = w
    g = rows.view(n, -1, 2 * Q8B_GROUP)                                      # [N, KP/32, 32]
    m = (g.amax(-1) + g.amin(-1)) * 0.5                                      # [N, KP/32]
    c = quantize_q8b((g - m[:, :, None]).view(n, kp)[:, :k])
    return Q8bCodes(q=c.q, a=c.a, m=m)


# ---------------------------------------------------------------- GGUF blocks, exactly
def _fp16(b: Tensor) -> Tensor:
    """Little-endian fp16 bytes [..., 2] -> fp32 [...]."""
    return b.contiguous().view(torch.float16).float().squeeze(-1)


def _nibbles(qs: Tensor) -> Tensor:
    """[..., 16] bytes -> [..., 32]: the low nibbles, then the high ones (the legacy types' order)."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def _five_bits(blocks: Tensor) -> Tensor:
    """The 5-bit codes [M, 32] of Q5_0 / Q5_1 blocks whose qh (4 bytes) and qs (16) end the block."""
    qh = blocks[:, -20:-16].to(torch.int64)
    bits = (qh[:, 0] | qh[:, 1] << 8 | qh[:, 2] << 16 | qh[:, 3] << 24)[:, None] >> torch.arange(32)   # [M, 32]
    return _nibbles(blocks[:, -16:]).to(torch.int16) | ((bits & 1) << 4).to(torch.int16)


def _legacy(blocks: Tensor, encoding: str) -> tuple[Tensor, Tensor, Tensor | None]:
    """Q8_0 / Q5_0 / Q4_0 / Q4_1 / Q5_1 blocks [M, bytes] -> codes int16 [M, 32] (q - zero point for the
    types without an offset), d fp32 [M], and the offset m fp32 [M] of Q4_1 / Q5_1 (None for the others)."""
    d = _fp16(blocks[:, :2])
    if encoding == "Q8_0":
        return blocks[:, 2:].contiguous().view(torch.int8).to(torch.int16), d, None
    if encoding == "Q4_0":
        return _nibbles(blocks[:, 2:]).to(torch.int16) - 8, d, None
    if encoding == "Q5_0":
        return _five_bits(blocks) - 16, d, None
    m = _fp16(blocks[:, 2:4])
    return (_nibbles(blocks[:, 4:]).to(torch.int16) if encoding == "Q4_1" else _five_bits(blocks)), d, m


def q6_k_blocks(blocks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Q6_K super-blocks [M, 210] (ql 128, qh 64, scales int8 16, d fp16) -> codes u uint8 [M, 256] in
    [0, 63] (w = d * sc * (u - 32)), sub-scales sc int8 [M, 16] (one per 16 outputs) and d fp32 [M]."""
    m = blocks.shape[0]
    ql = blocks[:, :128].reshape(m, 2, 1, 64)                                # two halves of 128 outputs
    qh = blocks[:, 128:192].reshape(m, 2, 1, 32)
    low = torch.cat([ql & 15, ql >> 4], dim=2).reshape(m, 2, 4, 32)         # output 128h + 32j + l
    high = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)) & 3
    u = (low | (high << 4)).reshape(m, 256)
    return u, blocks[:, 192:208].contiguous().view(torch.int8), _fp16(blocks[:, 208:210])


def _q6_k(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Q6_K super-blocks -> codes int16 [M, 256] (u - 32) and the scale of each 16 inputs, d * sc, fp32
    [M, 16] (exact: 11 by 8 significant bits)."""
    u, sc, d = q6_k_blocks(blocks)
    return u.to(torch.int16) - 32, d[:, None] * sc.float()


def q8b_from_gguf(data: Tensor, encoding: str, k: int) -> Q8bCodes:
    """The codes and scales (and Q4_1 / Q5_1's offsets: q8bm) of GGUF data of a type in Q8B_GGUF_TYPES or
    Q8BM_GGUF_TYPES: uint8 [N, bytes per row] for a weight of K inputs a row (a GGUF tensor's raw bytes, as
    zoo.gguf.iter_gguf_blocks gives them)."""
    if encoding not in Q8B_GGUF_TYPES + Q8BM_GGUF_TYPES:
        raise ValueError(f"q8b holds {list(Q8B_GGUF_TYPES)} exactly and q8bm {list(Q8BM_GGUF_TYPES)}, not "
                         f"{encoding}; quantize its fp32 values with pack_q8b instead")
    n = data.shape[0]
    per, size = (256, 210) if encoding == "Q6_K" else (32, _LEGACY_BYTES[encoding])
    if k % per or data.shape[-1] != k // per * size:
        raise ValueError(f"{encoding} data of {tuple(data.shape)} bytes is not {n} rows of {k} inputs")
    blocks = data.reshape(-1, size)
    m = None
    if encoding == "Q6_K":
        q, a = _q6_k(blocks)                                                 # [M, 256], [M, 16]
    else:
        q, d, m = _legacy(blocks, encoding)                                  # [M, 32], [M], [M] or None
        a = d[:, None].expand(-1, 2)                                         # both halves of a block
    kp = _round_up(k, Q8_KALIGN)                                             # K is a multiple of 32 here
    return Q8bCodes(q=q.reshape(n, kp).to(torch.int8), a=a.reshape(n, kp // Q8B_GROUP).contiguous(),
                    m=None if m is None else m.reshape(n, kp // (2 * Q8B_GROUP)).contiguous())


# ---------------------------------------------------------------- the kernel layout
def codes_by_strips(q: Tensor, n: int) -> Tensor:
    """int8 codes [N, KP] -> w8 u8 [NB, KP/4, 16, 4] = q + 128 (128 in the padding rows): q8b's and q80's."""
    kp = q.shape[1]
    np_ = _round_up(n, STRIP)
    w8 = torch.full((np_, kp), 128, dtype=torch.uint8)
    w8[:n] = (q.to(torch.int16) + 128).to(torch.uint8)
    return w8.view(np_ // STRIP, STRIP, kp // 4, 4).permute(0, 2, 1, 3).contiguous()


def codes_by_rows(w8: Tensor, n: int) -> Tensor:
    """Inverse of codes_by_strips: the int8 codes [N, KP] of the real N rows."""
    nb, kq = w8.shape[0], w8.shape[1]
    q = (w8.permute(0, 2, 1, 3).reshape(nb * STRIP, kq * 4).to(torch.int16) - 128).to(torch.int8)
    return q[:n].contiguous()


def pack_q8b_codes(c: Q8bCodes, n: int, k: int) -> dict[str, Tensor]:
    np_ = _round_up(n, STRIP)
    parts = {"w8": codes_by_strips(c.q, n), "sb": _by_strips(c.a, np_), "meta": _meta(n, k)}
    if c.m is not None:
        parts["mb"] = _by_strips(c.m, np_)
    return parts


def _by_strips(v: Tensor, np_: int) -> Tensor:
    """Per-row values [N, J] -> [NB, J, 16] (column-minor within a strip; 0 for the padding rows)."""
    out = torch.zeros(np_, v.shape[1], dtype=torch.float32)
    out[: v.shape[0]] = v
    return out.view(np_ // STRIP, STRIP, -1).permute(0, 2, 1).contiguous()


def _by_rows(v: Tensor, n: int) -> Tensor:
    """Inverse of _by_strips: [NB, J, 16] -> [N, J]."""
    return v.permute(0, 2, 1).reshape(v.shape[0] * STRIP, -1)[:n].contiguous()


def pack_q8b(weight: Tensor) -> dict[str, Tensor]:
    """{"w8", "sb", "meta"} of any fp32 weight [N, K] (quantize_q8b's codes)."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    return pack_q8b_codes(quantize_q8b(weight), n, k)


def pack_q8bm(weight: Tensor) -> dict[str, Tensor]:
    """{"w8", "sb", "mb", "meta"} of any fp32 weight [N, K] (quantize_q8bm's codes)."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    return pack_q8b_codes(quantize_q8bm(weight), n, k)


def pack_q8b_gguf(data: Tensor, encoding: str, k: int) -> dict[str, Tensor]:
    """{"w8", "sb", "meta"} of GGUF data of a type in Q8B_GGUF_TYPES, exactly (see q8b_from_gguf); and "mb"
    too (q8bm) for Q4_1 and Q5_1."""
    return pack_q8b_codes(q8b_from_gguf(data, encoding, k), data.shape[0], k)


def unpack_q8b(packed: dict[str, Tensor]) -> Q8bCodes:
    """Inverse layout of pack_q8b_codes: codes, scales (and q8bm's offsets) of the real N rows (KP columns)."""
    n, _ = (int(v) for v in packed["meta"])
    return Q8bCodes(q=codes_by_rows(packed["w8"], n), a=_by_rows(packed["sb"], n),
                    m=_by_rows(packed["mb"], n) if "mb" in packed else None)
