"""The q50 format: llama.cpp's Q5_0 in its own 5.5 bits a weight, w[n, k] = d[n, k // 32] * (u[n, k] - 16),
u in [0, 31] (four low bits and a fifth), d fp16.

q8b holds the same weights exactly at 10 bits (int8 codes, an fp32 scale per 16); q50 keeps the file's bits:
each block's 16 code bytes (the low 4 bits of its inputs, as q40 holds them), its 32 fifth bits and its fp16
d, only moved into strips. `pack_q50_gguf` reads Q5_0 blocks as the file stores them (no fp32 round trip);
`pack_q50` quantizes any fp32 weight as llama.cpp's reference quantizer does (quantize_row_q5_0_ref: d = the
block's value of largest magnitude / -16, u = min(31, trunc(w / d + 16.5))). The kernel computes a q50 weight
exactly as its q8b twin (`Q50Codes.q8b`: the codes u - 16 with a = d for both halves of each 32).

Layout (the kernel's; NB = ceil(N / 16) strips of 16 output columns, KP = K rounded up to 32, G = KP / 32;
in group g, quad j holds inputs 32g + 4j + i, i < 4):
  qs u8 [NB, G, 4, 16, 4] as q40's: byte (g, j, col, i) low nibble = the 4 low bits of input 32g + 4j + i,
      high nibble those of input 32g + 16 + 4j + i;
  qh u8 [NB, G, 16, 4]: bit j of byte (g, col, i) is the fifth bit of input 32g + 4j + i (j < 8), so that one
      byte serves the same lane of all 8 quads;
  sd f16 [NB, G, 16] as q40's (0 for padding; padding codes are u = 16, q = 0);  meta i64 [N, K].
Deterministic, like every packer here: the same weight gives the same bytes. This module never runs a matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.kernels.pack import STRIP, _meta, _round_up
from speczoo.kernels.pack_q8b import Q8bCodes
from speczoo.kernels.pack_q40 import (max_magnitude_codes, nibbles_by_rows, nibbles_by_strips, scales_by_rows,
                                      scales_by_strips)

Q50_GROUP = 32        # inputs per scale (a Q5_0 block)
_BLOCK_BYTES = 22     # a Q5_0 block: fp16 d, 4 bytes of fifth bits (little-endian, bit b: input b), 16 code bytes
_QUAD_BITS = torch.arange(8, dtype=torch.int64).view(8, 1)   # bit j of a qh byte: quad j


def _fifth_bits(qh: Tensor) -> Tensor:
    """Fifth bits as Q5_0 stores them, uint8 [N, G, 4] (a little-endian word, bit b: input b) -> [N, G, 32]."""
    q = qh.to(torch.int64)
    word = q[..., 0] | q[..., 1] << 8 | q[..., 2] << 16 | q[..., 3] << 24                     # [N, G]
    return (word[..., None] >> torch.arange(Q50_GROUP)) & 1


@dataclass
class Q50Codes:
    """q50 in plain order (KP = K rounded up to 32, G = KP / 32): qs uint8 [N, G, 16] and qh uint8 [N, G, 4]
    (each block's code bytes and fifth bits as Q5_0 stores them), d float16 [N, G]."""

    qs: Tensor
    qh: Tensor
    d: Tensor

    def codes(self) -> Tensor:  # -> [N, KP] int8, u - 16 in [-16, 15]
        n, g, _ = self.qs.shape
        low = torch.cat([self.qs & 15, self.qs >> 4], dim=-1).to(torch.int16)
        return ((low | (_fifth_bits(self.qh).to(torch.int16) << 4)) - 16).to(torch.int8).view(n, g * Q50_GROUP)

    def q8b(self) -> Q8bCodes:
        """The same weight as q8b codes and scales (d for both halves of each 32: exact)."""
        return Q8bCodes(q=self.codes(), a=self.d.float().repeat_interleave(2, dim=1))

    def dequantize(self) -> Tensor:  # -> [N, KP] fp32
        return self.q8b().dequantize()


def quantize_q50(weight: Tensor) -> Q50Codes:
    """Any fp32 weight [N, K] as llama.cpp's quantize_row_q5_0_ref quantizes it (pack_q40.max_magnitude_codes,
    bias 16), d stored in fp16."""
    u, d = max_magnitude_codes(weight, 16)                                   # [N, G, 32], [N, G]
    n, g, _ = u.shape
    fifth = (u >> 4).to(torch.int64).view(n, g, 4, 8)                        # [N, G, byte, bit]
    qh = (fifth << torch.arange(8)).sum(-1).to(torch.uint8)                  # the little-endian word's bytes
    return Q50Codes(qs=(u[..., :16] & 15) | ((u[..., 16:] & 15) << 4), qh=qh, d=d)


def q50_from_gguf(data: Tensor, encoding: str, k: int) -> Q50Codes:
    """The code bytes, fifth bits and scales of Q5_0 data, uint8 [N, bytes per row] for a weight of K inputs a
    row (a GGUF tensor's raw bytes, as zoo.gguf.iter_gguf_blocks gives them)."""
    if encoding != "Q5_0":
        raise ValueError(f"q50 holds Q5_0 exactly, not {encoding}; use q8b (pack_q8b_gguf) for the other legacy "
                         "types, or quantize its fp32 values with pack_q50")
    n = data.shape[0]
    if k % Q50_GROUP or data.shape[-1] != k // Q50_GROUP * _BLOCK_BYTES:
        raise ValueError(f"Q5_0 data of {tuple(data.shape)} bytes is not {n} rows of {k} inputs")
    blocks = data.reshape(n, k // Q50_GROUP, _BLOCK_BYTES)
    d = blocks[:, :, :2].contiguous().view(torch.float16).squeeze(-1)            # [N, G], the file's bits
    return Q50Codes(qs=blocks[:, :, 6:].contiguous(), qh=blocks[:, :, 2:6].contiguous(), d=d)


# ---------------------------------------------------------------- the kernel layout
def _lane_bits(qh: Tensor) -> Tensor:
    """Fifth bits as Q5_0 stores them [N, G, 4] -> [N, G, 4]: bit j of byte i is the bit of input 4j + i."""
    n, g, _ = qh.shape
    bits = _fifth_bits(qh).view(n, g, 8, 4)                                                   # [N, G, j, i]
    return (bits << _QUAD_BITS).sum(2).to(torch.uint8)


def _file_bits(lanes: Tensor) -> Tensor:
    """Inverse of _lane_bits."""
    n, g, _ = lanes.shape
    bits = (lanes.to(torch.int64)[:, :, None, :] >> _QUAD_BITS) & 1                         # [N, G, j, i]
    word = (bits.reshape(n, g, Q50_GROUP) << torch.arange(Q50_GROUP)).sum(-1)                # [N, G]
    return torch.stack([(word >> (8 * b)) & 255 for b in range(4)], dim=-1).to(torch.uint8)


def pack_q50_codes(c: Q50Codes, n: int, k: int) -> dict[str, Tensor]:
    g = c.qs.shape[1]
    np_ = _round_up(n, STRIP)
    qh = torch.full((np_, g, 4), 0xFF, dtype=torch.uint8)                    # padding: u = 0 + 16, q = 0
    qh[:n] = _lane_bits(c.qh)
    return {"qs": nibbles_by_strips(c.qs, n, pad=0), "qh": qh.view(np_ // STRIP, STRIP, g, 4).permute(0, 2, 1, 3)
            .contiguous(), "sd": scales_by_strips(c.d, n), "meta": _meta(n, k)}


def pack_q50(weight: Tensor) -> dict[str, Tensor]:
    """{"qs", "qh", "sd", "meta"} of any fp32 weight [N, K] (quantize_q50's codes)."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    return pack_q50_codes(quantize_q50(weight), n, k)


def pack_q50_gguf(data: Tensor, encoding: str, k: int) -> dict[str, Tensor]:
    """{"qs", "qh", "sd", "meta"} of Q5_0 data, exactly (see q50_from_gguf)."""
    return pack_q50_codes(q50_from_gguf(data, encoding, k), data.shape[0], k)


def unpack_q50(packed: dict[str, Tensor]) -> Q50Codes:
    """Inverse layout of pack_q50_codes: the code bytes, fifth bits and scales of the real N rows."""
    n, _ = (int(v) for v in packed["meta"])
    qh = packed["qh"]                                        # [NB, G, 16, 4]
    lanes = qh.permute(0, 2, 1, 3).reshape(qh.shape[0] * STRIP, qh.shape[1], 4)[:n]
    return Q50Codes(qs=nibbles_by_rows(packed["qs"], n), qh=_file_bits(lanes).contiguous(),
                    d=scales_by_rows(packed["sd"], n))
