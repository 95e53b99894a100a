"""The q40 format: llama.cpp's Q4_0 in its own 4.5 bits a weight, w[n, k] = d[n, k // 32] * (u[n, k] - 8),
u in [0, 15], d fp16.

q8b holds the same weights exactly at 10 bits (int8 codes, an fp32 scale per 16); q40 keeps the file's bytes:
the 16 code bytes of each block (low nibble input l, high nibble input l + 16) and its fp16 d, only moved into
strips. `pack_q40_gguf` reads Q4_0 blocks as the file stores them (no unpacking, no fp32 round trip);
`pack_q40` quantizes any fp32 weight as llama.cpp's reference quantizer does (quantize_row_q4_0_ref: d =
the block's value of largest magnitude / -8, u = min(15, trunc(w / d + 8.5))). The kernel computes a q40
weight exactly as its q8b twin (the codes u - 8 with a = d for both halves of each 32): `Q40Codes.q8b` is
that twin.

Layout (the kernel's; NB = ceil(N / 16) strips of 16 output columns, KP = K rounded up to 32, G = KP / 32;
in group g, quad j holds inputs 32g + 4j + i, i < 4):
  qs u8 [NB, G, 4, 16, 4]: byte (g, j, col, i) = the block's code byte 4j + i: low nibble u of input
      32g + 4j + i, high nibble input 32g + 16 + 4j + i (q6's ql, q4's qs);
  sd f16 [NB, G, 16]: d of each group of each column (0 for padding);  meta i64 [N, K].
Deterministic, like every packer here: the same weight gives the same bytes. This module never runs a matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.kernels.pack import (STRIP, Q8_KALIGN, _check_finite, _check_shape, _meta, _round_up,
                                   padded_rows)
from speczoo.kernels.pack_q8b import Q8bCodes

Q40_GROUP = 32        # inputs per scale (a Q4_0 block)
_BLOCK_BYTES = 18     # a Q4_0 block: fp16 d, then 16 code bytes
_PAD_CODES = 0x88     # two codes u = 8 (q = 0): what padding rows hold
_ROW_CHUNK = 512      # rows pack_q40 quantizes at a time


@dataclass
class Q40Codes:
    """q40 in plain order (KP = K rounded up to 32, G = KP / 32): qs uint8 [N, G, 16] (each block's code bytes
    as Q4_0 stores them), d float16 [N, G]."""

    qs: Tensor
    d: Tensor

    def codes(self) -> Tensor:  # -> [N, KP] int8, u - 8 in [-8, 7]
        n, g, _ = self.qs.shape
        return (torch.cat([self.qs & 15, self.qs >> 4], dim=-1).to(torch.int8) - 8).view(n, g * Q40_GROUP)

    def q8b(self) -> Q8bCodes:
        """The same weight as q8b codes and scales (d for both halves of each 32: exact)."""
        return Q8bCodes(q=self.codes(), a=self.d.float().repeat_interleave(2, dim=1))

    def dequantize(self) -> Tensor:  # -> [N, KP] fp32
        n, g, _ = self.qs.shape
        return (self.codes().view(n, g, Q40_GROUP).float() * self.d.float()[:, :, None]).view(n, g * Q40_GROUP)


def max_magnitude_codes(weight: Tensor, bias: int) -> tuple[Tensor, Tensor]:
    """llama.cpp's reference rounding of Q4_0 (bias 8) and Q5_0 (bias 16), per block of 32 of any fp32 weight
    [N, K] (K padded with zeros): m = the first value of largest magnitude, d = m / -bias, u = min(2 * bias - 1,
    trunc(w / d + bias + 0.5)) (all `bias` where d = 0). Returns u uint8 [N, G, 32] and d float16 [N, G]."""
    w = _check_shape(weight)
    n, k = w.shape
    kp = _round_up(k, Q8_KALIGN)
    g = kp // Q40_GROUP
    u = torch.empty(n, g, Q40_GROUP, dtype=torch.uint8)
    d = torch.empty(n, g, dtype=torch.float16)
    for r0, r1, rows in padded_rows(w, kp, _ROW_CHUNK):
        b = rows.view(r1 - r0, g, Q40_GROUP)                                 # [R, G, 32]
        _check_finite(bool(torch.isfinite(b).all()))
        m = b.gather(-1, b.abs().argmax(-1, keepdim=True))                   # [R, G, 1]: first largest |w|
        dd = m / -float(bias)
        inv = torch.where(dd != 0, 1.0 / torch.where(dd != 0, dd, torch.ones_like(dd)), torch.zeros_like(dd))
        u[r0:r1] = (b * inv + (bias + 0.5)).trunc_().clamp_(max=2 * bias - 1).to(torch.uint8)
        d[r0:r1] = dd.squeeze(-1).half()
    return u, d


def quantize_q40(weight: Tensor) -> Q40Codes:
    """Any fp32 weight [N, K] as llama.cpp's quantize_row_q4_0_ref quantizes it (max_magnitude_codes, bias 8),
    d stored in fp16."""
    u, d = max_magnitude_codes(weight, 8)
    return Q40Codes(qs=u[..., :16] | (u[..., 16:] << 4), d=d)


def q40_from_gguf(data: Tensor, encoding: str, k: int) -> Q40Codes:
    """The code bytes and scales of Q4_0 data, uint8 [N, bytes per row] for a weight of K inputs a row (a GGUF
    tensor's raw bytes, as zoo.gguf.iter_gguf_blocks gives them)."""
    if encoding != "Q4_0":
        raise ValueError(f"q40 holds Q4_0 exactly, not {encoding}; use q8b (pack_q8b_gguf) for Q8_0 / Q5_0 / Q6_K, "
                         "or quantize its fp32 values with pack_q40")
    n = data.shape[0]
    if k % Q40_GROUP or data.shape[-1] != k // Q40_GROUP * _BLOCK_BYTES:
        raise ValueError(f"Q4_0 data of {tuple(data.shape)} bytes is not {n} rows of {k} inputs")
    blocks = data.reshape(n, k // Q40_GROUP, _BLOCK_BYTES)
    d = blocks[:, :, :2].contiguous().view(torch.float16).squeeze(-1)            # [N, G], the file's bits
    return Q40Codes(qs=blocks[:, :, 2:].contiguous(), d=d)


# ---------------------------------------------------------------- the kernel layout
def scales_by_strips(d: Tensor, n: int) -> Tensor:
    """fp16 scales [N, G] -> sd [NB, G, 16] (0 for the padding rows): q40's, q50's and q80's."""
    g = d.shape[1]
    np_ = _round_up(n, STRIP)
    sd = torch.zeros(np_, g, dtype=torch.float16)
    sd[:n] = d
    return sd.view(np_ // STRIP, STRIP, g).permute(0, 2, 1).contiguous()


def scales_by_rows(sd: Tensor, n: int) -> Tensor:
    """Inverse of scales_by_strips: the scales [N, G] of the real N rows."""
    nb, g = sd.shape[0], sd.shape[1]
    return sd.permute(0, 2, 1).reshape(nb * STRIP, g)[:n].contiguous()


def nibbles_by_strips(qs: Tensor, n: int, pad: int = _PAD_CODES) -> Tensor:
    """Code bytes [N, G, 16] -> qs u8 [NB, G, 4, 16, 4] (`pad` in the padding rows): q40's and q50's."""
    g = qs.shape[1]
    np_ = _round_up(n, STRIP)
    out = torch.full((np_, g, 16), pad, dtype=torch.uint8)
    out[:n] = qs
    return out.view(np_ // STRIP, STRIP, g, 4, 4).permute(0, 2, 3, 1, 4).contiguous()


def nibbles_by_rows(qs: Tensor, n: int) -> Tensor:
    """Inverse of nibbles_by_strips: the code bytes [N, G, 16] of the real N rows."""
    nb, g = qs.shape[0], qs.shape[1]
    return qs.permute(0, 3, 1, 2, 4).reshape(nb * STRIP, g, 16)[:n].contiguous()


def pack_q40_codes(c: Q40Codes, n: int, k: int) -> dict[str, Tensor]:
    return {"qs": nibbles_by_strips(c.qs, n), "sd": scales_by_strips(c.d, n), "meta": _meta(n, k)}


def pack_q40(weight: Tensor) -> dict[str, Tensor]:
    """{"qs", "sd", "meta"} of any fp32 weight [N, K] (quantize_q40's codes)."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    return pack_q40_codes(quantize_q40(weight), n, k)


def pack_q40_gguf(data: Tensor, encoding: str, k: int) -> dict[str, Tensor]:
    """{"qs", "sd", "meta"} of Q4_0 data, exactly (see q40_from_gguf)."""
    return pack_q40_codes(q40_from_gguf(data, encoding, k), data.shape[0], k)


def unpack_q40(packed: dict[str, Tensor]) -> Q40Codes:
    """Inverse layout of pack_q40_codes: the code bytes and scales of the real N rows."""
    n, _ = (int(v) for v in packed["meta"])
    return Q40Codes(qs=nibbles_by_rows(packed["qs"], n), d=scales_by_rows(packed["sd"], n))
