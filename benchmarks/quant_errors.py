"""The relative weight error of each kernel format on real GGUF tensors, per source type: the figures that
decide zoo/policy.py's table (docs/results.md, "Every GGUF type: the kernel format of each").

    python -m benchmarks.quant_errors [FILE.gguf ...] [--requant Q4_0,Q5_0,...] [--per-type 8]
    python -m benchmarks.quant_errors OUT.gguf --against IN.gguf    # OUT: IN through llama-quantize
    python -m benchmarks.quant_errors --write-gaussian IN.gguf      # an F32 model of Gaussian weights

For each linear weight of each file (default: the zoo's assembled GGUFs in its downloads), and each
candidate format: each of zoo/policy.py PACKERS from the fp32 values (q8: int8 with one scale per row; q8b:
int8 per 16 inputs; q8bm: q8b of what is left after an offset per 32; q6: 6-bit per 16; q4 by the packer's
search), and each format transcoded block for block where the type has a transcoder (Q4_K -> q4, Q6_K -> q6,
Q4_0 -> q40, Q8_0/Q5_0/Q4_0/Q3_K -> q8b, Q4_1/Q5_1/Q5_K -> q8bm), the error ||packed - source|| /
||source|| against the tensor's own dequantized values, summed over the type's tensors. `--requant`
also quantizes the first file's F32-decoded weights (its Q4_K/Q6_K/... values taken as the "original")
to each type gguf can quantize, and measures those. At most --per-type tensors of each type are taken,
spread over the layers (the search costs ~0.1-0.3 us per weight). "own" is the type's own rounding: the
error of its values against the weights it was quantized from (the requantized ones, or with --against
the same tensor of the file it was made from), the yardstick a packing's error is set against. Prints
one row per (file or requant, type). `--write-gaussian` writes an F32 GGUF of Gaussian weights (2 layers of
hidden 2048, FFN 5632) to quantize with llama-quantize: its "own" errors are each type's rounding of
weights that were never quantized before. A measurement script: never imported by the package.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from speczoo.kernels.pack import Rows, WeightError
from speczoo.models.loader import LINEAR_WEIGHT_PATTERN, dequantize
from speczoo.paths import downloads_dir
from speczoo.zoo.gguf import open_gguf
from speczoo.zoo.policy import PACKERS, POLICY, TRANSCODERS

from benchmarks.pull_scale import write_gguf

GAUSSIAN_SHAPES = dict(layers=2, dim=2048, heads=16, kv_heads=4, head_dim=128, ffn=5632, vocab=4096)


def _spread(items: list, n: int) -> list:
    if len(items) <= n:
        return items
    idx = np.linspace(0, len(items) - 1, n).round().astype(int)
    return [items[i] for i in idx]


def measure(kind: str, raw: torch.Tensor, w: torch.Tensor, formats: dict[str, WeightError]) -> None:
    """Add one tensor's errors under each candidate format. raw: its blocks; w: fp32 [N, K] values."""
    for fmt, pack in PACKERS.items():
        pack(Rows.of(w), formats.setdefault(fmt if fmt != "q4" else "q4 search", WeightError()))
    for (source, fmt), transcode in TRANSCODERS.items():
        if source == kind:
            transcode(kind, raw, *w.shape, formats.setdefault(f"{fmt} transcode", WeightError()))


def _values(t) -> torch.Tensor:
    kind = t.tensor_type.name
    return dequantize(np.array(t.data, copy=True), kind)


def file_rows(path: Path, per_type: int, against: Path | None = None) -> dict[str, tuple[int, dict[str, WeightError]]]:
    reader = open_gguf(path)
    original = {t.name: t for t in open_gguf(against).tensors} if against else {}
    by_type: dict[str, list] = defaultdict(list)
    for t in reader.tensors:
        if LINEAR_WEIGHT_PATTERN.match(t.name) and len(t.shape) == 2:
            by_type[t.tensor_type.name].append(t)
    out = {}
    for kind, tensors in sorted(by_type.items()):
        formats: dict[str, WeightError] = {}
        n = 0
        for t in _spread(tensors, per_type):
            raw = torch.from_numpy(np.array(t.data, copy=True).view(np.uint8) if kind != "F32"
                                   else np.array(t.data, copy=True))
            w = dequantize(raw, kind)
            measure(kind, raw, w, formats)
            if t.name in original:
                formats.setdefault("own", WeightError()).add(w, _values(original[t.name]).reshape(w.shape))
            n += 1
        out[kind] = (n, formats)
    return out


def requant_rows(path: Path, kinds: list[str], per_type: int) -> dict[str, tuple[int, dict[str, WeightError]]]:
    import gguf

    reader = open_gguf(path)
    tensors = _spread([t for t in reader.tensors if LINEAR_WEIGHT_PATTERN.match(t.name) and len(t.shape) == 2
                       and t.shape[0] % 256 == 0], per_type)
    out = {}
    for kind in kinds:
        qtype = gguf.GGMLQuantizationType[kind]
        formats: dict[str, WeightError] = {}
        for t in tensors:
            src = t.tensor_type.name
            orig = dequantize(np.array(t.data, copy=True), src).numpy()
            q = np.ascontiguousarray(gguf.quants.quantize(orig, qtype))
            raw = torch.from_numpy(q if kind == "F32" else q.view(np.uint8))
            w = dequantize(raw, kind)
            measure(kind, raw, w, formats)
            formats.setdefault("own", WeightError()).add(w, torch.from_numpy(orig))
        out[kind] = (len(tensors), formats)
    return out


def _print(label: str, rows: dict[str, tuple[int, dict[str, WeightError]]]) -> None:
    for kind, (n, formats) in rows.items():
        rule = POLICY.get(kind)
        cells = "  ".join(f"{f} {e.relative:8.4%}" for f, e in sorted(formats.items()))
        chosen = f"{rule.format}{' (exact)' if rule.exact else ''}" if rule else "no rule"
        print(f"{label:<28} {kind:<8} {n:>3} tensors  {cells}   policy: {chosen}", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--requant", default="", help="comma-separated GGUF types gguf can quantize to")
    p.add_argument("--per-type", type=int, default=8)
    p.add_argument("--against", type=Path, default=None, help="the GGUF the files were quantized from")
    p.add_argument("--write-gaussian", type=Path, default=None, help="write an F32 GGUF of Gaussian weights and stop")
    args = p.parse_args(argv)
    if args.write_gaussian:
        write_gguf(args.write_gaussian, "F32", GAUSSIAN_SHAPES)
        return
    torch.set_num_threads(1)
    files = args.files or sorted(downloads_dir().glob("*.gguf"))
    t0 = time.perf_counter()
    for f in files:
        _print(f.name, file_rows(f, args.per_type, args.against))
    if args.requant and files:
        _print(f"{files[0].name} requantized", requant_rows(files[0], args.requant.split(","), args.per_type))
    print(f"[{time.perf_counter() - t0:.0f} s]")


if __name__ == "__main__":
    main()
