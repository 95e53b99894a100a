"""What a verify's rows cost once the weights are streamed: the kernels' integer tiles timed alone, in L1.

    python -m benchmarks.tile_cycles [--path avx2] [--windows 400] [--calls 300]

Builds benchmarks/tile_cycles.cpp against the kernels' own tiles (src/speczoo/kernels/cpu_tiles.h) with the
flags of the kernel path that runs here (or --path), and prints, for q4 (Q4_K), q6 (Q6_K) and q50 (Q5_0) at
every tile height R, the nanoseconds one activation row costs per 512 weight-rows (a group of 32 inputs of a
16-column strip), and whether the R-row tile equals R one-row tiles bit for bit. Each figure is the fastest
of --windows windows of --calls calls: a tenant that steals the machine in bursts leaves some windows
quiet, which a median over long passes (kernel_bench) cannot find. A model's verify of S rows costs at
least S times the sum of these figures over its weights on each core, beside streaming them once
(docs/results.md, "Where a step's time goes against this Zen 3's floors").

This module must never be imported by the runtime: it is a measurement script.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from speczoo.kernels import native

SOURCE = Path(__file__).with_name("tile_cycles.cpp")
FORMATS = ("q4", "q6", "q50")
LIBRARY_ONLY = ("-shared", "-fPIC", "-fvisibility=hidden")   # build flags a program does not take


@dataclass(frozen=True)
class TileTime:
    fmt: str
    rows: int              # R, the tile's height
    ns: float              # per 512 weight-rows, one activation row
    invariant: bool        # the R-row tile equals R one-row tiles, bit for bit


def build(path: native.KernelPath, out_dir: Path) -> Path:
    """The harness compiled for `path` into out_dir; a KernelBuildError with the compiler's words if not."""
    cxx = native.compiler()
    flags = [f for f in native.build_flags(path, cxx) if f not in LIBRARY_ONLY]
    exe = out_dir / f"tile_cycles-{path.name}"
    cmd = [cxx, *flags, f"-I{native.SOURCES[0].parent}", str(SOURCE), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise native.KernelBuildError(f"compiling the tile harness failed ({' '.join(cmd)}):\n"
                                      f"{proc.stderr.strip()[-2000:]}")
    return exe


def parse(text: str) -> list[TileTime]:
    """The harness's lines "fmt R ns invariant" -> TileTimes."""
    out = []
    for line in text.splitlines():
        fmt, rows, ns, inv = line.split()
        out.append(TileTime(fmt, int(rows), float(ns), inv == "1"))
    return out


def measure(path: native.KernelPath, windows: int, calls: int) -> list[TileTime]:
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(path, Path(tmp))
        proc = subprocess.run([str(exe), str(windows), str(calls)], capture_output=True, text=True, check=True)
    return parse(proc.stdout)


def report(times: list[TileTime], path: native.KernelPath) -> str:
    heights = sorted({t.rows for t in times})
    lines = [f"== {path.name} tiles, ns per 512 weight-rows (one activation row), fastest window",
             "   fmt " + "".join(f"{'R=' + str(r):>9}" for r in heights) + "   invariant"]
    for fmt in FORMATS:
        row = {t.rows: t for t in times if t.fmt == fmt}
        cells = "".join(f"{row[r].ns:9.2f}" for r in heights)
        ok = "yes" if all(t.invariant for t in row.values()) else "NO"
        lines.append(f"  {fmt:>4} {cells}   {ok}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default=None, help="kernel path (default: the one the kernels run here)")
    ap.add_argument("--windows", type=int, default=400, help="timed windows; each figure is the fastest")
    ap.add_argument("--calls", type=int, default=300, help="tile calls a window")
    args = ap.parse_args(argv)
    if args.windows < 1 or args.calls < 1:
        ap.error("--windows and --calls must be positive")
    path = native.path_named(args.path) if args.path else native.chosen_path()
    times = measure(path, args.windows, args.calls)
    print(report(times, path))
    if not all(t.invariant for t in times):
        raise SystemExit("a tile's rows differ from the same rows run alone: the kernels are not batch-invariant")


if __name__ == "__main__":
    main()
