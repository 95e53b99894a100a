"""The float formats "f32", "f16" and "bf16": a weight stored as fp32, fp16 or bf16 values, for the float
kernels (cpu_float.h), which take fp32 activations and quantize nothing.

They hold a GGUF's F32, F16 and BF16 tensors bit for bit: every fp16 and bf16 value is an fp32 value, so
the fp32 rows a pull decodes go back to their own element type unchanged (the pull measures the error, 0).
`pack_float` of any other fp32 weight rounds it to the element type (nearest, ties to even), as torch's
conversion does; a value past fp16's range is refused, not stored as inf.

Layout (the kernel's; NB = ceil(N / 16) strips of 16 output columns, KP = K rounded up to 16):
  w<fmt> [NB, 4, KP/16, 4, 16] of the element type: strip b, column group g, chunk c, column j, input i holds
  w[16b + 4g + j, 16c + i] (the kernel's register tiles take 4 columns, or all 16, at a time: each group of
  4 is one stream read front to back, one 16-input chunk of its columns after another), zero padding past N
  and K; the part is named "wf32", "wf16" or "wbf16", so a packing says its format by its parts;
  meta i64 [N, K].
Deterministic, like every packer here: the same weight gives the same bytes. This module never runs a matmul.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speczoo.kernels.pack import STRIP, _check_finite, _check_shape, _meta, _round_up

FLOAT_KALIGN = 16        # inputs per chunk of the kernel's 16 lanes; K is padded to a multiple
GROUPS = 4               # column groups of a strip (4 columns each)
FLOAT_DTYPES: dict[str, torch.dtype] = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def float_part(fmt: str) -> str:
    """The name of the one packed part of float format `fmt` ("wf16" for "f16")."""
    return f"w{fmt}"


def pack_float(weight: Tensor, fmt: str) -> dict[str, Tensor]:
    """{"w<fmt>": [NB, 4, KP/16, 4, 16] of fmt's element type, "meta": i64 [N, K]} from an fp32 weight [N, K]."""
    if fmt not in FLOAT_DTYPES:
        raise ValueError(f"unknown float format {fmt!r}; known: {sorted(FLOAT_DTYPES)}")
    w = _check_shape(weight)                                        # [N, K] fp32
    n, k = w.shape
    nb, kp = -(-n // STRIP), _round_up(k, FLOAT_KALIGN)
    out = torch.zeros(nb * STRIP, kp, dtype=FLOAT_DTYPES[fmt])
    _check_finite(bool(torch.isfinite(w).all()))
    out[:n, :k] = w
    if not bool(torch.isfinite(out[:n, :k]).all()):
        raise ValueError(f"the weight has values beyond {fmt}'s range (largest |w| = {float(w.abs().max()):.6g}); "
                         "pack it as f32")
    chunks = out.view(nb, GROUPS, STRIP // GROUPS, kp // FLOAT_KALIGN, FLOAT_KALIGN).permute(0, 1, 3, 2, 4).contiguous()
    return {float_part(fmt): chunks, "meta": _meta(n, k)}


def float_format(packed: dict[str, Tensor]) -> str | None:
    """The float format whose part `packed` holds, or None."""
    for fmt in FLOAT_DTYPES:
        if float_part(fmt) in packed:
            return fmt
    return None


def float_values(packed: dict[str, Tensor]) -> Tensor:
    """The values a float packing stores, in plain order [N, K] and their own element type."""
    fmt = float_format(packed)
    if fmt is None:
        raise ValueError(f"packed parts {sorted(packed)} are no float format's ({[float_part(f) for f in FLOAT_DTYPES]})")
    n, k = (int(v) for v in packed["meta"])
    w = packed[float_part(fmt)]                                     # [NB, 4, KP/16, 4, 16]
    nb, kc = w.shape[0], w.shape[2]
    return w.permute(0, 1, 3, 2, 4).reshape(nb * STRIP, kc * FLOAT_KALIGN)[:n, :k]


def unpack_float(packed: dict[str, Tensor]) -> Tensor:
    """The weight a float packing holds, fp32 [N, K] (exactly its stored values)."""
    return float_values(packed).float()
