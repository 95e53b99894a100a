"""Which compiled kernel format each GGUF tensor type is stored in, and the packing of one source tensor.

    rule = POLICY["Q6_K"]                       # Rule(format="q6", exact=True)
    packed = pack_tensor("Q4_K", raw, backend)  # PackedTensor: parts, format, measured error

The rule (issue #28): a weight goes to the kernel format that holds its type exactly, else to the nearest
one above its precision; none drops below its source's precision. The formats are the batch-invariant
compiled ones of kernels/quantized.py KERNEL_FORMATS:
  q4   4-bit codes, 6- or 8-bit sub-scales and mins per 32, fp32 scales per 256: holds Q4_K exactly;
  q6   6-bit codes, int8 sub-scales per 16, fp32 scale per 256: holds Q6_K exactly (6.6 bits a weight);
  q40  4-bit codes, one fp16 scale per 32: Q4_0 in its own bytes (4.5 bits a weight);
  q50  q40's codes with a fifth bit: Q5_0 in its own bits (5.5 bits a weight);
  q80  int8 codes, one fp16 scale per 32: Q8_0 in its own bytes (8.5 bits a weight);
  q8b  int8 codes, one fp32 scale per 16: holds Q3_K exactly (codes d * q, no offset), and Q8_0, Q5_0 and
       Q4_0 too (at 10 bits a weight, where q80, q50 and q40 hold them in their own 8.5, 5.5 and 4.5);
  q8bm q8b plus one fp32 offset per 32: holds Q4_1, Q5_1 and Q5_K exactly (d * q + m);
  q8   int8 codes, one fp32 scale per output row: holds no GGUF type exactly; kept so that bundles of
       earlier pulls load, never chosen here (q8b is finer on every weight);
  f32, f16, bf16   the weight's own float values (4, 2, 2 bytes a weight) with fp32 activations, nothing
       quantized (kernels/pack_float.py, cpu_float.h): hold F32, F16 and BF16 exactly.
Exact rows are transcoded from the file's blocks (models/gguf_blocks.py, kernels/pack_q8b.py, pack_q6.py, pack_q40.py,
pack_q50.py, pack_q80.py:
no search, no fp32 round trip). A type no format holds (non-linear codebooks; Q2_K's 16-value sub-blocks
with a min each) goes to q8b packed from its fp32 values: int8 codes with a scale per 16
inputs, the nearest grid above every one of them. q6 from fp32 is not above them: on Gaussian weights
quantized by llama-quantize it re-rounds IQ4_NL and IQ4_XS values at 1.9-2.0% of their norm, a
quarter of those types' own rounding (7.6-7.7%), where q8b re-rounds them at 0.27% (and Q2_K, IQ3_S at
0.44-0.53%; q8's per-row scale at 0.73-0.84%). Those rows carry their measured error:
`speczoo pull` prints it per type, the manifest keeps it, and docs/results.md ("Every GGUF type") has each
row's figure with the command that measured it.

F32, F16 and BF16 weights go to the float format of their own element type: the decoded fp32 rows convert
back to fp16 / bf16 unchanged, so the measured error is 0. Their kernel is batch-invariant (one fixed-order
dot product per output), which torch's F.linear (kernels/linear.py Fp32Backend) is not: its sums depend on
the batch, so the speculative output would not equal plain greedy. F32 is never narrowed to f16 or bf16,
even where its values would fit: a rule is per type, and an F32 tensor's values are not known to fit.

This module never lets a weight drop below its type's precision to save bytes, never packs a type it
has no rule for (the pull refuses it up front: `check_types`), and never hides a packing's error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor

from speczoo.errors import SpeczooError
from speczoo.kernels.linear import LinearBackend
from speczoo.kernels.pack import (STRIP, Rows, WeightError, concat_rows, pack_q4, pack_q4_codes, pack_q8,
                                  unpack_q4, unpack_q8)
from speczoo.kernels.pack_float import FLOAT_DTYPES, pack_float, unpack_float
from speczoo.kernels.pack_q6 import pack_q6, pack_q6_codes, q6_from_gguf, unpack_q6
from speczoo.kernels.pack_q40 import pack_q40, pack_q40_codes, q40_from_gguf, unpack_q40
from speczoo.kernels.pack_q50 import pack_q50, pack_q50_codes, q50_from_gguf, unpack_q50
from speczoo.kernels.pack_q80 import pack_q80, pack_q80_codes, q80_from_gguf, unpack_q80
from speczoo.kernels.pack_q8b import (Q8B_GGUF_TYPES, Q8BM_GGUF_TYPES, pack_q8b, pack_q8b_codes, pack_q8bm,
                                      q8b_from_gguf, unpack_q8b)
from speczoo.kernels.quantized import MixedBackend, kernel_format
from speczoo.models.gguf_blocks import k_quant_codes, q4_k_codes
from speczoo.models.loader import dequantize, gguf_dequantize

_ROW_CHUNK = 1 << 17          # weights decoded and packed at a time (in whole rows: they stay in cache)


@dataclass(frozen=True)
class Rule:
    format: str               # a kernel format (kernels/quantized.py KERNEL_FORMATS)
    exact: bool               # the format holds every value of the type (up to fp32 rounding)


_Q8B = Rule("q8b", exact=False)
# One row per GGUF type a weight may have; "F32" also stands for a Hugging Face tensor (read as fp32).
# Measured errors of each row: docs/results.md, "Every GGUF type: the kernel format of each".
POLICY: dict[str, Rule] = {
    "Q4_K": Rule("q4", exact=True),      # transcoded block for block (gguf_blocks.q4_k_codes)
    "Q6_K": Rule("q6", exact=True),      # transcoded block for block (pack_q6.q6_from_gguf)
    # int8, 5- or 4-bit codes minus their zero point, times one fp16 d per 32: each in its own bits, moved
    # into strips (pack_q80.q80_from_gguf, pack_q50.q50_from_gguf, pack_q40.q40_from_gguf)
    "Q8_0": Rule("q80", exact=True),
    "Q5_0": Rule("q50", exact=True),
    "Q4_0": Rule("q40", exact=True),
    # 5/4-bit codes times one fp16 d plus one fp16 m per 32: q8bm's codes, scales and offsets
    **{t: Rule("q8bm", exact=True) for t in Q8BM_GGUF_TYPES},
    "Q5_K": Rule("q8bm", exact=True),    # (d * sc) * q - dmin * m per 32 (gguf_blocks.k_quant_codes)
    "Q3_K": Rule("q8b", exact=True),     # (d * sc) * q per 16, q in [-4, 3] (gguf_blocks.k_quant_codes)
    # No format holds them (non-linear codebooks; Q2_K's min per 16 inputs): q8b's int8 grid per 16 inputs
    # is the nearest above each
    **{t: _Q8B for t in ("IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4", "Q2_K", "IQ1_S",
                         "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "TQ1_0", "TQ2_0")},
    # Their own float values, fp32 activations (kernels/pack_float.py)
    "F32": Rule("f32", exact=True),
    "F16": Rule("f16", exact=True),
    "BF16": Rule("bf16", exact=True),
}


def _by_rows(pack: Callable[[Tensor], dict[str, Tensor]]) -> Callable[[Rows, WeightError], dict[str, Tensor]]:
    """A row-local packer (each row's codes depend on that row only) run on whole strips of rows at a time,
    its error measured on the way; the joined parts are the bytes of packing every row at once."""

    def run(rows: Rows, error: WeightError) -> dict[str, Tensor]:
        n, k = rows.shape
        step = max(STRIP, _ROW_CHUNK // k // STRIP * STRIP)
        parts = []
        for r0 in range(0, n, step):
            w = rows.read(r0, min(n, r0 + step))                  # [R, K] fp32
            parts.append(pack(w))
            error.add(packed_values(parts[-1], k), w)
        return concat_rows(parts)

    return run


# How a kernel format is made from fp32 rows; PACKERS[fmt](rows, error) -> parts.
PACKERS: dict[str, Callable[[Rows, WeightError], dict[str, Tensor]]] = {
    "q8": pack_q8,
    "q8b": _by_rows(pack_q8b),
    "q8bm": _by_rows(pack_q8bm),
    "q6": _by_rows(pack_q6),
    "q40": _by_rows(pack_q40),
    "q50": _by_rows(pack_q50),
    "q80": _by_rows(pack_q80),
    "q4": lambda rows, error: pack_q4(rows.read(0, rows.shape[0]), error),
    **{fmt: _by_rows(functools.partial(pack_float, fmt=fmt)) for fmt in FLOAT_DTYPES},
}


@dataclass(frozen=True)
class _Transcode:
    """A format made straight from a type's blocks: codes(raw rows, type, K) -> its plain codes (with
    .dequantize() and the scales `finite` checks), pack(codes, N, K) -> parts."""

    codes: Callable[[Tensor, str, int], object]
    finite: Callable[[object], bool]
    pack: Callable[[object, int, int], dict[str, Tensor]]

    def __call__(self, kind: str, raw: Tensor, n: int, k: int, error: WeightError) -> dict[str, Tensor]:
        """Rows [N, R] of type `kind` -> the packing of exactly their values, whole strips of rows at a time.
        The error is 0 by construction; it is measured on the first strip against gguf's own decoder (an
        independent implementation, so a transcode one code off shows), not on every row, where measuring
        would cost ten times the transcode."""
        step = max(STRIP, _ROW_CHUNK // k // STRIP * STRIP)
        parts = []
        for r0 in range(0, n, step):
            block = raw[r0:r0 + step]
            c = self.codes(block, kind, k)
            if not self.finite(c):
                raise ValueError("the weight has NaN or inf values; quantizing it would hide that, fix the source")
            if r0 == 0:
                error.add(c.dequantize()[:STRIP, :k], gguf_dequantize(block[:STRIP].numpy(), kind))
            parts.append(self.pack(c, block.shape[0], k))
        return concat_rows(parts)


def _all_finite(*ts: Tensor) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts)


_Q4_FROM_BLOCKS = _Transcode(lambda raw, kind, k: q4_k_codes(raw), lambda c: _all_finite(c.d, c.dm), pack_q4_codes)
_Q8B_FROM_BLOCKS = _Transcode(q8b_from_gguf, lambda c: _all_finite(c.a, *([] if c.m is None else [c.m])),
                              pack_q8b_codes)
_K_FROM_BLOCKS = _Transcode(lambda raw, kind, k: k_quant_codes(raw, kind), _Q8B_FROM_BLOCKS.finite, pack_q8b_codes)
_Q6_FROM_BLOCKS = _Transcode(q6_from_gguf, lambda c: _all_finite(c.d), pack_q6_codes)
_Q40_FROM_BLOCKS = _Transcode(q40_from_gguf, lambda c: _all_finite(c.d), pack_q40_codes)
_Q50_FROM_BLOCKS = _Transcode(q50_from_gguf, lambda c: _all_finite(c.d), pack_q50_codes)
_Q80_FROM_BLOCKS = _Transcode(q80_from_gguf, lambda c: _all_finite(c.d), pack_q80_codes)

# (source type, format) -> the packing made straight from the source's blocks (no fp32 detour, no search).
TRANSCODERS: dict[tuple[str, str], _Transcode] = {
    ("Q4_K", "q4"): _Q4_FROM_BLOCKS,
    ("Q6_K", "q6"): _Q6_FROM_BLOCKS,
    ("Q4_0", "q40"): _Q40_FROM_BLOCKS,
    ("Q5_0", "q50"): _Q50_FROM_BLOCKS,
    ("Q8_0", "q80"): _Q80_FROM_BLOCKS,
    **{(t, "q8b"): _Q8B_FROM_BLOCKS for t in Q8B_GGUF_TYPES},
    **{(t, "q8bm"): _Q8B_FROM_BLOCKS for t in Q8BM_GGUF_TYPES},
    **{(t, fmt): _K_FROM_BLOCKS for t, fmt in (("Q5_K", "q8bm"), ("Q3_K", "q8b"))},
}


# ---------------------------------------------------------------- which types a pull can read

_DECODABLE: dict[str, bool] = {}


def decodable(kind: str) -> bool:
    """Can speczoo turn tensors of GGUF type `kind` into fp32 (its own decoders or gguf's)?"""
    if kind not in _DECODABLE:
        import gguf

        try:
            qtype = gguf.GGMLQuantizationType[kind]
            _, type_size = gguf.GGML_QUANT_SIZES[qtype]
            gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
            _DECODABLE[kind] = True
        except (KeyError, NotImplementedError, ValueError):
            _DECODABLE[kind] = False
    return _DECODABLE[kind]


def check_types(types: dict[str, str], linear: set[str]) -> None:
    """Refuse a source up front when a tensor's type cannot be decoded, or a linear weight's has no rule.
    types: tensor name -> GGUF type name; linear: the names a backend packs."""
    bad = {n: t for n, t in types.items() if not decodable(t) or (n in linear and t not in POLICY)}
    if bad:
        shown = ", ".join(f"{n} ({t})" for n, t in list(bad.items())[:6]) + (" ..." if len(bad) > 6 else "")
        raise SpeczooError(
            f"{len(bad)} tensor(s) of this GGUF are of a type speczoo cannot read: {shown}. speczoo reads "
            f"{sorted(POLICY)}; convert the model to one of those with llama.cpp's llama-quantize "
            f"(e.g. `llama-quantize --allow-requantize IN.gguf OUT.gguf Q4_K_M`)")


# ---------------------------------------------------------------- one tensor

@dataclass
class PackedTensor:
    parts: dict[str, Tensor]
    format: str               # the kernel format of `parts`
    error: WeightError        # the packing against the source's fp32 values
    weights: int              # N * K


def source_rows(kind: str | None, data: Tensor) -> Rows:
    """The fp32 rows of a source tensor: fp32 data as it is (kind None or "F32"), GGUF blocks decoded a chunk
    of rows at a time. data: fp32 [N, K] or uint8 [N, bytes per row]."""
    if kind in (None, "F32"):
        return Rows.of(data)
    width = dequantize(data[:1], kind).shape[1]
    return Rows((data.shape[0], width), lambda r0, r1: dequantize(data[r0:r1], kind))


def pack_tensor(kind: str | None, data: Tensor, backend: LinearBackend) -> PackedTensor:
    """Pack one linear weight of source type `kind` for `backend`: the mixed backend by POLICY (straight from
    the blocks where a transcoder exists), any other by its own pack(); the error is measured either way."""
    error = WeightError()
    if isinstance(backend, MixedBackend):
        fmt = POLICY[kind or "F32"].format
        rows = source_rows(kind, data)
        transcode = TRANSCODERS.get((kind or "F32", fmt))
        n, k = rows.shape
        if transcode is not None:
            return PackedTensor(transcode(kind, data, n, k, error), fmt, error, n * k)
        return PackedTensor(PACKERS[fmt](rows, error), fmt, error, n * k)
    w = source_rows(kind, data).read(0, data.shape[0])               # [N, K] fp32
    parts = backend.pack(w)
    error.add(packed_values(parts, w.shape[1]), w)
    return PackedTensor(parts, _format_name(parts, backend), error, w.numel())


def _format_name(parts: dict[str, Tensor], backend: LinearBackend) -> str:
    try:
        return kernel_format(parts)
    except ValueError:                       # a float backend's packing (fp32, bf16): named by its backend
        return backend.name


def packed_values(parts: dict[str, Tensor], k: int) -> Tensor:
    """The fp32 weight a packing holds [N, K] (for its error): q4, q6, q40, q8b and q8bm codes dequantized, q8 codes
    times scales, a float format's values, a float backend's weight as it is."""
    if "weight" in parts:
        return parts["weight"].float()
    fmt = kernel_format(parts)
    if fmt in FLOAT_DTYPES:
        return unpack_float(parts)
    if fmt == "q8":
        q, scale = unpack_q8(parts)
        return q.float() * scale[:, None]
    return _UNPACK[fmt](parts).dequantize()[:, :k]


_UNPACK: dict[str, Callable[[dict[str, Tensor]], object]] = {"q4": unpack_q4, "q6": unpack_q6, "q40": unpack_q40,
                                                             "q50": unpack_q50, "q80": unpack_q80,
                                                             "q8b": unpack_q8b, "q8bm": unpack_q8b}


# ---------------------------------------------------------------- the report

@dataclass
class PackRow:
    """One line of the packing table: the tensors of one source type that went to one kernel format."""

    source_type: str
    format: str
    exact: bool
    tensors: int
    weights: int
    err2: float
    ref2: float

    @property
    def relative_error(self) -> float:
        return WeightError(self.err2, self.ref2).relative

    def to_json(self) -> dict:
        return {**asdict(self), "relative_error": self.relative_error}

    @classmethod
    def from_json(cls, d: dict) -> PackRow:
        return cls(**{k: v for k, v in d.items() if k != "relative_error"})


class PackReport:
    """The packing table of a pull, one row per (source type, kernel format), in first-seen order."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], PackRow] = {}

    def add(self, kind: str | None, packed: PackedTensor) -> None:
        key = (kind or "F32", packed.format)
        rule = POLICY.get(key[0])
        row = self.rows.setdefault(key, PackRow(key[0], packed.format, bool(rule and rule.exact
                                                                          and rule.format == packed.format),
                                                0, 0, 0.0, 0.0))
        row.tensors += 1
        row.weights += packed.weights
        row.err2 += packed.error.err2
        row.ref2 += packed.error.ref2

    def to_json(self) -> list[dict]:
        return [r.to_json() for r in self.rows.values()]


@dataclass
class StaleRow:
    source_type: str
    format: str               # the format a packing holds the type in
    wanted: str               # the format POLICY gives it now


def stale_rows(rows: list[PackRow]) -> list[StaleRow]:
    """The rows of a stored packing table whose type POLICY now puts in another format (a bundle packed
    by an earlier table; it still loads, build_compiled reads any format, and a plain pull re-packs it)."""
    return [StaleRow(r.source_type, r.format, POLICY[r.source_type].format) for r in rows
            if r.source_type in POLICY and POLICY[r.source_type].format != r.format]


def summary(rows: list[PackRow]) -> str:
    """One line of a packing table: "Q4_K->q4 exact, Q6_K->q8 1.12%, ..."."""
    return ", ".join(f"{r.source_type}->{r.format} " + ("exact" if r.exact and r.err2 == 0 else f"{r.relative_error:.2%}")
                     for r in rows)
