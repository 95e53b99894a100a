"""GGUF block types decoded in torch, bit for bit the values of `gguf.quants`, and Q4_K, Q5_K, Q3_K transcoded
to the codes of the kernel format that holds each exactly.

    decode(rows, "Q6_K")      # uint8 [N, bytes per row] -> fp32 [N, K], or None when no torch decoder exists
    q4_k_codes(rows)          # uint8 [N, bytes per row] of Q4_K -> Q4Codes holding exactly its values
    k_quant_codes(rows, "Q5_K")   # Q5_K -> q8bm's Q8bCodes, Q3_K -> q8b's, exactly its values

gguf's decoders are vectorized numpy over groups of 16 rows; these do the same arithmetic (every product
and sum in fp32, in gguf's order, nothing fused) with torch ops over whole chunks of rows, several times
faster, so a pull spends its time packing rather than decoding. Each decoder is held to gguf's values on
random blocks of every bit pattern that gives finite values (tests/models/test_gguf_blocks.py). A type with no
torch decoder here (the IQ and ternary types) is decoded by gguf itself (models/loader.py `dequantize`).

Block layouts are ggml's (ggml-common.h): fp16 scales, packed 4/5/6-bit codes, 6-bit sub-scales packed
12 bytes to 8 pairs. This module knows GGUF's block encodings and nothing about models; it must never
round a value differently from gguf.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from speczoo.kernels.pack import Q4Codes
from speczoo.kernels.pack_q8b import Q8bCodes

QK_K = 256
BLOCK_BYTES = {"F16": 2, "BF16": 2, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34,
               "Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
BLOCK_VALUES = {"F16": 1, "BF16": 1, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32,
                "Q2_K": QK_K, "Q3_K": QK_K, "Q4_K": QK_K, "Q5_K": QK_K, "Q6_K": QK_K}


def _blocks(rows: Tensor, kind: str) -> Tensor:
    """uint8 rows [N, R] -> blocks [N, B, bytes per block]."""
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] % BLOCK_BYTES[kind]:
        raise ValueError(f"{kind} rows must be uint8 [N, a multiple of {BLOCK_BYTES[kind]} bytes], got "
                         f"{rows.dtype} {tuple(rows.shape)}")
    return rows.reshape(rows.shape[0], -1, BLOCK_BYTES[kind])


def _f16(b: Tensor, at: int) -> Tensor:
    """The fp16 at byte `at` of each block [N, B, T] -> fp32 [N, B, 1]."""
    return b[..., at:at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: Tensor) -> Tensor:
    """Bytes [..., J] -> their low nibbles then their high ones [..., 2, J] (ggml's order within a run)."""
    return torch.stack([qs & 15, qs >> 4], dim=-2)


def _bits(b: Tensor, shifts: range | tuple[int, ...], mask: int) -> Tensor:
    """Bytes [..., J] -> (b >> s) & mask for each shift s: [..., len(shifts), J]."""
    return torch.stack([(b >> s) & mask for s in shifts], dim=-2)


def _k_scales(scales: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K / Q5_K's 12 bytes of packed 6-bit sub-scales [N, B, 12] -> sc, m uint8 [N, B, 8]."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=-1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=-1)
    return sc, mn


def _f16_rows(rows: Tensor) -> Tensor:
    return rows.contiguous().view(torch.float16).float()


def _bf16_rows(rows: Tensor) -> Tensor:
    return (rows.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)


def _q8_0(rows: Tensor) -> Tensor:
    b = _blocks(rows, "Q8_0")
    return b[..., 2:].contiguous().view(torch.int8).float() * _f16(b, 0)


def _q4_0(rows: Tensor) -> Tensor:
    b = _blocks(rows, "Q4_0")
    q = _nibbles(b[..., 2:]).flatten(-2).to(torch.int8) - 8                     # [N, B, 32]
    return _f16(b, 0) * q.float()


def _q4_1(rows: Tensor) -> Tensor:
    b = _blocks(rows, "Q4_1")
    q = _nibbles(b[..., 4:]).flatten(-2).float()
    return _f16(b, 0) * q + _f16(b, 2)


def _q5_codes(qh: Tensor, qs: Tensor) -> Tensor:
    """5-bit codes of a block of 32 from qh (4 bytes, bit i: value i's top bit) and qs [..., 16]."""
    high = _bits(qh, range(8), 1).transpose(-1, -2).flatten(-2)                 # [N, B, 32]: byte i//8, bit i%8
    return _nibbles(qs).flatten(-2) | (high << 4)


def _q5_0(rows: Tensor) -> Tensor:
    b = _blocks(rows, "Q5_0")
    q = _q5_codes(b[..., 2:6], b[..., 6:]).to(torch.int8) - 16
    return _f16(b, 0) * q.float()


def _q5_1(rows: Tensor) -> Tensor:
    b = _blocks(rows, "Q5_1")
    q = _q5_codes(b[..., 4:8], b[..., 8:]).float()
    return _f16(b, 0) * q + _f16(b, 2)


def _q2_k(rows: Tensor) -> Tensor:
    b = _blocks(rows, "Q2_K")
    n, nb = b.shape[:2]
    scales = b[..., :16]
    dl = (_f16(b, 80) * (scales & 15).float())[..., None]                       # [N, B, 16, 1]
    ml = (_f16(b, 82) * (scales >> 4).float())[..., None]
    q = _bits(b[..., 16:80].reshape(n, nb, 2, 1, 32), (0, 2, 4, 6), 3)          # [N, B, 2, 1, 4, 32]
    q = q.reshape(n, nb, 16, 16).float()
    return (dl * q - ml).reshape(n, nb, QK_K)


def _q3_k_parts(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Q3_K rows -> codes int8 [N, B, 16, 16] in [-4, 3] and the scale of each 16, d * sc, fp32 [N, B, 16]."""
    b = _blocks(rows, "Q3_K")
    n, nb = b.shape[:2]
    hmask, qs, scales = b[..., :32], b[..., 32:96], b[..., 96:108]
    low = _nibbles(scales[..., :8]).reshape(n, nb, 16)                          # l & 15 of each nibble
    high = _bits(scales[..., 8:12], (0, 2, 4, 6), 3).reshape(n, nb, 16)
    sc = ((low | (high << 4)).to(torch.int8) - 32).float()
    ql = _bits(qs.reshape(n, nb, 2, 1, 32), (0, 2, 4, 6), 3).reshape(n, nb, 16, 16)
    qh = _bits(hmask.reshape(n, nb, 1, 32), range(8), 1).reshape(n, nb, 16, 16) ^ 1
    return ql.to(torch.int8) - (qh << 2).to(torch.int8), _f16(b, 108) * sc


def _q3_k(rows: Tensor) -> Tensor:
    q, dl = _q3_k_parts(rows)
    return (dl[..., None] * q.float()).reshape(q.shape[0], -1, QK_K)


def _q4_k(rows: Tensor) -> Tensor:
    b = _blocks(rows, "Q4_K")
    n, nb = b.shape[:2]
    sc, mn = _k_scales(b[..., 4:16])
    d = (_f16(b, 0) * sc.float())[..., None]                                     # [N, B, 8, 1]
    dm = (_f16(b, 2) * mn.float())[..., None]
    q = _nibbles(b[..., 16:].reshape(n, nb, 4, 32)).reshape(n, nb, 8, 32).float()
    return (d * q - dm).reshape(n, nb, QK_K)


def _q5_k_parts(rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Q5_K rows -> codes uint8 [N, B, 8, 32] in [0, 31], the scale d * sc and the min dmin * m of each 32,
    fp32 [N, B, 8] (w = (d * sc) * q - dmin * m)."""
    b = _blocks(rows, "Q5_K")
    n, nb = b.shape[:2]
    sc, mn = _k_scales(b[..., 4:16])
    ql = _nibbles(b[..., 48:].reshape(n, nb, 4, 32)).reshape(n, nb, 8, 32)
    qh = _bits(b[..., 16:48], range(8), 1)                                       # [N, B, 8, 32]
    return ql | (qh << 4), _f16(b, 0) * sc.float(), _f16(b, 2) * mn.float()


def _q5_k(rows: Tensor) -> Tensor:
    q, d, dm = _q5_k_parts(rows)
    return (d[..., None] * q.float() - dm[..., None]).reshape(q.shape[0], -1, QK_K)


def _q6_k(rows: Tensor) -> Tensor:
    b = _blocks(rows, "Q6_K")
    n, nb = b.shape[:2]
    ql = _nibbles(b[..., :128].reshape(n, nb, 2, 64)).reshape(n, nb, 8, 32)     # [N, B, half*2+nib, 64]
    qh = _bits(b[..., 128:192].reshape(n, nb, 2, 32), (0, 2, 4, 6), 3).reshape(n, nb, 8, 32)
    q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(n, nb, 16, 16).float()
    d = (_f16(b, 208) * b[..., 192:208].contiguous().view(torch.int8).float())[..., None]   # [N, B, 16, 1]
    return (d * q).reshape(n, nb, QK_K)


_DECODERS: dict[str, Callable[[Tensor], Tensor]] = {
    "F16": _f16_rows, "BF16": _bf16_rows, "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0,
    "Q5_1": _q5_1, "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
TORCH_TYPES = tuple(_DECODERS)


def decode(rows: Tensor, kind: str) -> Tensor | None:
    """uint8 rows [N, R] of GGUF type `kind` -> fp32 [N, K] (gguf.quants' values, bit for bit); None when
    this module has no decoder for `kind` (the caller asks gguf)."""
    fn = _DECODERS.get(kind)
    if fn is None:
        return None
    return fn(rows).reshape(rows.shape[0], -1)


def q4_k_codes(rows: Tensor) -> Q4Codes:
    """Q4_K rows [N, R] -> the q4 codes of exactly its values: Q4_K's w = (d * sc) * q - (dmin * m) with fp16
    d, dmin per 256 values and 6-bit sc, m per 32 is q4's w = (D * sc) * q - (Dm * m) with D = d, Dm = dmin,
    so `Q4Codes.dequantize` gives gguf's values bit for bit, and no search runs."""
    b = _blocks(rows, "Q4_K")
    n, nb = b.shape[:2]
    sc, mn = _k_scales(b[..., 4:16])                                             # [N, B, 8]
    q = _nibbles(b[..., 16:].reshape(n, nb, 4, 32)).reshape(n, nb * QK_K)        # [N, KP] in [0, 15]
    return Q4Codes(q=q.contiguous(), sc=sc.reshape(n, -1).contiguous(), m=mn.reshape(n, -1).contiguous(),
                   d=_f16(b, 0)[..., 0].contiguous(), dm=_f16(b, 2)[..., 0].contiguous())


def k_quant_codes(rows: Tensor, kind: str) -> Q8bCodes:
    """Q5_K or Q3_K rows [N, R] -> the codes of the format that holds exactly their values: Q5_K's w =
    (d * sc) * q - dmin * m per 32 is q8bm's a * q + m with a = d * sc (both halves) and m = -(dmin * m);
    Q3_K's w = (d * sc) * q per 16, q in [-4, 3], is q8b's a * q. Each scale is an fp16 times a 6-bit
    integer (exact in fp32) and each sum is gguf's, so `Q8bCodes.dequantize` gives gguf's values bit for bit."""
    n = rows.shape[0]
    if kind == "Q3_K":
        q, a = _q3_k_parts(rows)                                                  # [N, B, 16, 16], [N, B, 16]
        return Q8bCodes(q=q.reshape(n, -1).contiguous(), a=a.reshape(n, -1).contiguous())
    if kind != "Q5_K":
        raise ValueError(f"k_quant_codes transcodes Q5_K and Q3_K, not {kind}")
    q, d, dm = _q5_k_parts(rows)                                                  # [N, B, 8, 32], [N, B, 8] x 2
    return Q8bCodes(q=q.reshape(n, -1).to(torch.int8).contiguous(),
                    a=d[..., None].expand(-1, -1, -1, 2).reshape(n, -1).contiguous(),       # both halves of a 32
                    m=(-dm).reshape(n, -1).contiguous())
