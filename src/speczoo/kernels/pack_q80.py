"""The q80 format: llama.cpp's Q8_0 in its own 8.5 bits a weight, w[n, k] = d[n, k // 32] * q[n, k], q int8,
d fp16.

q8b holds the same weights exactly at 10 bits (an fp32 scale per 16); q80 keeps the file's codes and its fp16
d per block, only moved into strips: the codes in q8b's layout, the scales in q40's. `pack_q80_gguf` reads
Q8_0 blocks as the file stores them (no fp32 round trip); `pack_q80` quantizes any fp32 weight as llama.cpp's
reference quantizer does (quantize_row_q8_0_ref: d = the block's largest magnitude / 127, q = round(w / d),
halves away from zero). The kernel computes a q80 weight exactly as its q8b twin (`Q80Codes.q8b`: the codes
with a = d for both halves of each 32).

Layout (the kernel's; NB = ceil(N / 16) strips of 16 output columns, KP = K rounded up to 32):
  w8 u8 [NB, KP/4, 16, 4] = q + 128, as q8b's;  sd f16 [NB, KP/32, 16]: d of each group of each column (0 for
  padding), as q40's;  meta i64 [N, K].
Deterministic, like every packer here: the same weight gives the same bytes. This module never runs a matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.kernels.pack import Q8_KALIGN, _check_finite, _check_shape, _meta, _round_up, padded_rows
from speczoo.kernels.pack_q8b import Q8bCodes, codes_by_rows, codes_by_strips
from speczoo.kernels.pack_q40 import scales_by_rows, scales_by_strips

Q80_GROUP = 32        # inputs per scale (a Q8_0 block)
_BLOCK_BYTES = 34     # a Q8_0 block: fp16 d, then 32 int8 codes
_ROW_CHUNK = 512      # rows pack_q80 quantizes at a time


@dataclass
class Q80Codes:
    """q80 in plain order (KP = K rounded up to 32, G = KP / 32): q int8 [N, KP], d float16 [N, G]."""

    q: Tensor
    d: Tensor

    def q8b(self) -> Q8bCodes:
        """The same weight as q8b codes and scales (d for both halves of each 32: exact)."""
        return Q8bCodes(q=self.q, a=self.d.float().repeat_interleave(2, dim=1))

    def dequantize(self) -> Tensor:  # -> [N, KP] fp32
        return self.q8b().dequantize()


def quantize_q80(weight: Tensor) -> Q80Codes:
    """Any fp32 weight [N, K] as llama.cpp's quantize_row_q8_0_ref quantizes it, per block of 32 (K padded
    with zeros): d = amax / 127, q = round(w / d) with halves away from zero (all 0 where d = 0), d stored in
    fp16 (the codes are made with the fp32 d, as llama.cpp makes them)."""
    w = _check_shape(weight)
    n, k = w.shape
    kp = _round_up(k, Q8_KALIGN)
    q = torch.empty(n, kp, dtype=torch.int8)
    d = torch.empty(n, kp // Q80_GROUP, dtype=torch.float16)
    for r0, r1, rows in padded_rows(w, kp, _ROW_CHUNK):
        b = rows.view(r1 - r0, -1, Q80_GROUP)                                # [R, G, 32]
        amax = b.abs().amax(-1, keepdim=True)                                # [R, G, 1]; NaN/inf propagate
        _check_finite(bool(torch.isfinite(amax).all()))
        dd = amax / 127.0
        inv = torch.where(dd > 0, 1.0 / torch.where(dd > 0, dd, torch.ones_like(dd)), torch.zeros_like(dd))
        x = b * inv
        q[r0:r1] = (x.sign() * (x.abs() + 0.5).floor()).clamp_(-127, 127).to(torch.int8).view(r1 - r0, kp)
        d[r0:r1] = dd.squeeze(-1).half()
    return Q80Codes(q=q, d=d)


def q80_from_gguf(data: Tensor, encoding: str, k: int) -> Q80Codes:
    """The codes and scales of Q8_0 data, uint8 [N, bytes per row] for a weight of K inputs a row (a GGUF
    tensor's raw bytes, as zoo.gguf.iter_gguf_blocks gives them)."""
    if encoding != "Q8_0":
        raise ValueError(f"q80 holds Q8_0 exactly, not {encoding}; use q8b (pack_q8b_gguf) for the other legacy "
                         "types, or quantize its fp32 values with pack_q80")
    n = data.shape[0]
    if k % Q80_GROUP or data.shape[-1] != k // Q80_GROUP * _BLOCK_BYTES:
        raise ValueError(f"Q8_0 data of {tuple(data.shape)} bytes is not {n} rows of {k} inputs")
    blocks = data.reshape(n, k // Q80_GROUP, _BLOCK_BYTES)
    d = blocks[:, :, :2].contiguous().view(torch.float16).squeeze(-1)            # [N, G], the file's bits
    return Q80Codes(q=blocks[:, :, 2:].contiguous().view(torch.int8).reshape(n, k), d=d)


# ---------------------------------------------------------------- the kernel layout
def pack_q80_codes(c: Q80Codes, n: int, k: int) -> dict[str, Tensor]:
    return {"w8": codes_by_strips(c.q, n), "sd": scales_by_strips(c.d, n), "meta": _meta(n, k)}


def pack_q80(weight: Tensor) -> dict[str, Tensor]:
    """{"w8", "sd", "meta"} of any fp32 weight [N, K] (quantize_q80's codes)."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    return pack_q80_codes(quantize_q80(weight), n, k)


def pack_q80_gguf(data: Tensor, encoding: str, k: int) -> dict[str, Tensor]:
    """{"w8", "sd", "meta"} of Q8_0 data, exactly (see q80_from_gguf)."""
    return pack_q80_codes(q80_from_gguf(data, encoding, k), data.shape[0], k)


def unpack_q80(packed: dict[str, Tensor]) -> Q80Codes:
    """Inverse layout of pack_q80_codes: the codes and scales of the real N rows."""
    n, _ = (int(v) for v in packed["meta"])
    return Q80Codes(q=codes_by_rows(packed["w8"], n), d=scales_by_rows(packed["sd"], n))
