"""The q6 format: 6-bit codes with an int8 sub-scale per 16 inputs and an fp32 scale per 256, as Q6_K.

w[n, k] = D[n, k // 256] * sc[n, k // 16] * (u[n, k] - 32), u in [0, 63]: llama.cpp's Q6_K exactly, at 6.6
bits per weight (q8b holds the same weights at 10). `pack_q6_gguf` reads Q6_K blocks as the file stores
them; `pack_q6` quantizes any fp32 weight on that grid (16-input scales amax / 31, their int8 multiples of a
256-input D), about 6 bits. The kernel computes a q6 weight exactly as its q8b twin (the codes u - 32 with
the scales D * sc, exact in fp32): `Q6Codes.q8b` is that twin.

Layout (the kernel's; NB = ceil(N / 16) strips of 16 output columns, KP = K rounded up to 32, KB =
ceil(KP / 256); in a group g of 32 inputs, quad jq holds inputs 32g + 4jq + i, i < 4):
  ql u8 [NB, KP/32, 4, 16, 4]: low nibble the low 4 bits of u in quad j, high nibble quad j + 4 (q4's qs);
  qh u8 [NB, KP/32, 2, 16, 4]: byte (h, col, i) holds bits 4-5 of u of quad 4h + m at bits 2m;
  sc i8 [NB, KP/16, 16];  dd f32 [NB, KB, 16] (D);  meta i64 [N, K].
Deterministic: the same weight gives the same bytes. This module never runs a matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.kernels.pack import (STRIP, SUPER, Q8_KALIGN, _check_finite, _check_shape, _meta, _round_up,
                                   padded_rows)
from speczoo.kernels.pack_q8b import Q8B_GROUP, Q8bCodes, q6_k_blocks

_ROW_CHUNK = 256      # rows pack_q6 quantizes at a time


@dataclass
class Q6Codes:
    """q6 in plain order (KP = K rounded up to 32): u uint8 [N, KP], sc int8 [N, KP/16], d fp32 [N, KB]."""

    u: Tensor
    sc: Tensor
    d: Tensor

    def q8b(self) -> Q8bCodes:
        """The same weight as q8b codes (u - 32) and scales (D * sc, exact)."""
        d16 = self.d.repeat_interleave(SUPER // Q8B_GROUP, dim=1)[:, : self.sc.shape[1]]
        return Q8bCodes(q=(self.u.to(torch.int16) - 32).to(torch.int8), a=d16 * self.sc.float())

    def dequantize(self) -> Tensor:  # -> [N, KP] fp32
        return self.q8b().dequantize()


def quantize_q6(weight: Tensor) -> Q6Codes:
    """Any fp32 weight [N, K] on q6's grid: per 16 inputs s = amax / 31, per 256 D = max s / 127, sc =
    round(s / D), u = round(w / (D * sc)) + 32 clamped to [0, 63]."""
    w = _check_shape(weight)
    n, k = w.shape
    kp = _round_up(k, Q8_KALIGN)
    kb = -(-kp // SUPER)
    u = torch.full((n, kp), 32, dtype=torch.uint8)
    sc = torch.zeros(n, kp // Q8B_GROUP, dtype=torch.int8)
    d = torch.zeros(n, kb, dtype=torch.float32)
    for r0, r1, rows in padded_rows(w, kb * SUPER, _ROW_CHUNK):
        g = rows.view(r1 - r0, kb, SUPER // Q8B_GROUP, Q8B_GROUP)                # [R, KB, 16, 16]
        s = g.abs().amax(-1) / 31.0                                              # [R, KB, 16]
        _check_finite(bool(torch.isfinite(s).all()))
        dd = s.amax(-1) / 127.0                                                  # [R, KB]
        safe = torch.where(dd > 0, dd, torch.ones_like(dd))[:, :, None]
        scq = torch.where(dd[:, :, None] > 0, (s / safe).round_().clamp_(0, 127), torch.zeros_like(s))
        a = (dd[:, :, None] * scq)[..., None]                                     # [R, KB, 16, 1]
        q = torch.where(a > 0, (g / torch.where(a > 0, a, torch.ones_like(a))).round_().clamp_(-32, 31),
                        torch.zeros_like(g))
        u[r0:r1] = (q + 32).view(r1 - r0, -1)[:, :kp].to(torch.uint8)
        sc[r0:r1] = scq.view(r1 - r0, -1)[:, : kp // Q8B_GROUP].to(torch.int8)
        d[r0:r1] = dd
    return Q6Codes(u=u, sc=sc, d=d)


def q6_from_gguf(data: Tensor, encoding: str, k: int) -> Q6Codes:
    """The codes and scales of Q6_K data, uint8 [N, bytes per row] for a weight of K inputs a row."""
    if encoding != "Q6_K":
        raise ValueError(f"q6 holds Q6_K exactly, not {encoding}; quantize its fp32 values with pack_q6, or use "
                         "q8b (pack_q8b_gguf) for Q8_0 / Q5_0, q40 (pack_q40_gguf) for Q4_0")
    n = data.shape[0]
    if k % SUPER or data.shape[-1] != k // SUPER * 210:
        raise ValueError(f"Q6_K data of {tuple(data.shape)} bytes is not {n} rows of {k} inputs")
    u, sc, d = q6_k_blocks(data.reshape(-1, 210))                                # [M, 256], [M, 16], [M]
    return Q6Codes(u=u.reshape(n, k), sc=sc.reshape(n, k // Q8B_GROUP), d=d.reshape(n, k // SUPER))


def pack_q6_codes(c: Q6Codes, n: int, k: int) -> dict[str, Tensor]:
    kp = c.u.shape[1]
    np_ = _round_up(n, STRIP)
    nb, g = np_ // STRIP, kp // 32

    def pad_rows(t: Tensor, fill: int = 0) -> Tensor:
        out = torch.full((np_,) + tuple(t.shape[1:]), fill, dtype=t.dtype)
        out[:n] = t
        return out

    u = pad_rows(c.u, 32).view(nb, STRIP, g, 8, 4).permute(0, 2, 3, 1, 4)      # [NB, G, jq, col, i]
    ql = (u[:, :, :4] & 15) | ((u[:, :, 4:] & 15) << 4)                         # [NB, G, 4, 16, 4]
    hi = (u >> 4).reshape(nb, g, 2, 4, STRIP, 4)                                 # [NB, G, h, m, col, i]
    qh = hi[:, :, :, 0] | (hi[:, :, :, 1] << 2) | (hi[:, :, :, 2] << 4) | (hi[:, :, :, 3] << 6)
    sc = pad_rows(c.sc).view(nb, STRIP, -1).permute(0, 2, 1)                    # [NB, KP/16, 16]
    dd = pad_rows(c.d).view(nb, STRIP, -1).permute(0, 2, 1)                     # [NB, KB, 16]
    return {"ql": ql.contiguous(), "qh": qh.contiguous(), "sc": sc.contiguous(), "dd": dd.contiguous(),
            "meta": _meta(n, k)}


def pack_q6(weight: Tensor) -> dict[str, Tensor]:
    """{"ql", "qh", "sc", "dd", "meta"} of any fp32 weight [N, K] (quantize_q6's codes)."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    return pack_q6_codes(quantize_q6(weight), n, k)


def pack_q6_gguf(data: Tensor, encoding: str, k: int) -> dict[str, Tensor]:
    """{"ql", "qh", "sc", "dd", "meta"} of Q6_K data, exactly (see q6_from_gguf)."""
    return pack_q6_codes(q6_from_gguf(data, encoding, k), data.shape[0], k)


def unpack_q6(packed: dict[str, Tensor]) -> Q6Codes:
    """Inverse layout of pack_q6_codes: the codes and scales of the real N rows."""
    n, _ = (int(v) for v in packed["meta"])
    ql, qh = packed["ql"], packed["qh"]                      # [NB, G, 4, 16, 4], [NB, G, 2, 16, 4]
    nb, g = ql.shape[0], ql.shape[1]
    low = torch.cat([ql & 15, ql >> 4], dim=2)                                   # [NB, G, jq, col, i]
    hi = torch.stack([(qh >> (2 * m)) & 3 for m in range(4)], dim=3).reshape(nb, g, 8, STRIP, 4)
    u = (low | (hi << 4)).permute(0, 3, 1, 2, 4).reshape(nb * STRIP, g * 32)
    sc = packed["sc"].permute(0, 2, 1).reshape(nb * STRIP, -1)
    d = packed["dd"].permute(0, 2, 1).reshape(nb * STRIP, -1)
    return Q6Codes(u=u[:n].contiguous(), sc=sc[:n].contiguous(), d=d[:n].contiguous())
