"""Which compiled kernel format each GGUF tensor type is stored in, and the packing of one source tensor.

    rule = POLICY["Q6_K"]                       # Rule(format="q8", exact=False)
    packed = pack_tensor("Q4_K", raw, backend)  # PackedTensor: parts, format, measured error

The rule (issue #28): a weight goes to the kernel format that holds its type exactly, else to the nearest
one above its precision; none drops below its source's precision. The formats are the batch-invariant
compiled ones of kernels/quantized.py KERNEL_FORMATS: q4 (4-bit codes, 6- or 8-bit sub-scales per 32,
fp32 scales per 256) and q8 (int8, one fp32 scale per output row). q4 holds Q4_K exactly, block for block
(models/gguf_blocks.py `q4_k_codes`: no search); nothing else is on q4's grid, so every other type goes to
q8, the most precise format there is. q8's one scale per row does not hold any GGUF type exactly (their
scales are per block of 32 or 16 values), so those rows carry a measured error: `speczoo pull` prints it
per type, the manifest keeps it, and docs/results.md ("Every GGUF type") has each row's figure on real
tensors with the command that measured it. A new kernel format that holds a type exactly (int8 with a
scale per block, say) is one entry in KERNEL_FORMATS and PACKERS and a changed row here.

This module never lets a weight drop below its type's precision to save bytes, never packs a type it
has no rule for (the pull refuses it up front: `check_types`), and never hides a packing's error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor

from speczoo.errors import SpeczooError
from speczoo.kernels.linear import LinearBackend
from speczoo.kernels.pack import (STRIP, Rows, WeightError, concat_rows, pack_q4, pack_q4_codes, pack_q8,
                                  unpack_q4, unpack_q8)
from speczoo.kernels.quantized import MixedBackend, kernel_format
from speczoo.models.gguf_blocks import q4_k_codes
from speczoo.models.loader import dequantize, gguf_dequantize

_ROW_CHUNK = 1 << 17          # weights decoded and packed at a time (in whole rows: they stay in cache)


@dataclass(frozen=True)
class Rule:
    format: str               # a kernel format (kernels/quantized.py KERNEL_FORMATS)
    exact: bool               # the format holds every value of the type (up to fp32 rounding)


_Q8 = Rule("q8", exact=False)
# One row per GGUF type a weight may have; "F32" also stands for a Hugging Face tensor (read as fp32).
# Measured errors of each row: docs/results.md, "Every GGUF type: the kernel format of each".
POLICY: dict[str, Rule] = {
    "Q4_K": Rule("q4", exact=True),      # transcoded block for block (gguf_blocks.q4_k_codes)
    # Above 4 bits, or 4 bits on another grid (per-32 fp16 scales, offsets, non-linear codebooks): no
    # q4 grid holds them; q8 is the nearest format above. F32/F16/BF16 lose the most (no batch-invariant
    # float kernel exists), the 8-bit types about q8's own rounding.
    **{t: _Q8 for t in ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q5_1", "Q4_0", "Q4_1",
                        "IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4")},
    # Below 4 bits: q4 would need their 16-value sub-blocks' two scales in one group of 32; q8's row grid
    # is finer than any of them, so it holds them within its rounding (measured lower than q4's search).
    **{t: _Q8 for t in ("Q2_K", "Q3_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                        "TQ1_0", "TQ2_0")},
}

# How a kernel format is made from fp32 rows; PACKERS[fmt](rows, error) -> parts.
PACKERS: dict[str, Callable[[Rows, WeightError], dict[str, Tensor]]] = {
    "q8": pack_q8,
    "q4": lambda rows, error: pack_q4(rows.read(0, rows.shape[0]), error),
}


def _q4_from_q4_k(raw: Tensor, n: int, k: int, error: WeightError) -> dict[str, Tensor]:
    """Q4_K rows [N, R] -> the q4 packing of exactly their values, whole strips of rows at a time. The
    error is 0 by construction; it is measured on the first strip against gguf's own decoder (an
    independent implementation, so a transcode one code off shows), not on every row, where measuring
    would cost ten times the transcode."""
    step = max(STRIP, _ROW_CHUNK // k // STRIP * STRIP)
    parts = []
    for r0 in range(0, n, step):
        block = raw[r0:r0 + step]
        c = q4_k_codes(block)
        if not bool(torch.isfinite(c.d).all() and torch.isfinite(c.dm).all()):
            raise ValueError("the weight has NaN or inf values; quantizing it would hide that, fix the source")
        if r0 == 0:
            error.add(c.dequantize()[:STRIP], gguf_dequantize(block[:STRIP].numpy(), "Q4_K"))
        parts.append(pack_q4_codes(c, block.shape[0], k))
    return concat_rows(parts)


# (source type, format) -> the packing made straight from the source's blocks (no fp32 detour, no search).
TRANSCODERS: dict[tuple[str, str], Callable[[Tensor, int, int, WeightError], dict[str, Tensor]]] = {
    ("Q4_K", "q4"): _q4_from_q4_k,
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
            return PackedTensor(transcode(data, n, k, error), fmt, error, n * k)
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
    """The fp32 weight a packing holds [N, K] (for its error): q4 codes dequantized, q8 codes times scales,
    a float backend's weight as it is."""
    if "qs" in parts:
        return unpack_q4(parts).dequantize()[:, :k]
    if "w8" in parts:
        q, scale = unpack_q8(parts)
        return q.float() * scale[:, None]
    return parts["weight"].float()


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


def summary(rows: list[PackRow]) -> str:
    """One line of a packing table: "Q4_K->q4 exact, Q6_K->q8 1.12%, ..."."""
    return ", ".join(f"{r.source_type}->{r.format} " + ("exact" if r.exact and r.err2 == 0 else f"{r.relative_error:.2%}")
                     for r in rows)
