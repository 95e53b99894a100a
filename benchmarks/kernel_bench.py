"""Time the linear backends on Qwen2.5-Coder-1.5B's layer shapes: ms per layer, GB/s, c_v(S), tok/s.

    python -m benchmarks.kernel_bench [--backend q4,q8,q8_torch,bf16,fp32] [--reps 5]

Each shape is timed over enough distinct weight copies that every call streams its weights from DRAM,
not from the 32 MiB L3 (as a real forward does). Packed weights are random bytes of the right layout:
speed does not depend on the values, and packing 1.5B random weights would take minutes. Reports the
median of --reps timed passes after one warm-up pass; every backend is timed in the same run, so the
ratios between them hold even when other processes load the machine. The whole-model estimate sums
28 layers (q, k, v, o, gate, up, down) plus the LM head: attention, norms and sampling are not in it.

`--floor` also times each shape with its weights in cache (a slice of CACHED_BYTES, called over and
over): the time one more row adds, r = (t_cache(S_last) - t_cache(S_first)) / (S_last - S_first),
scaled to the whole shape, is the cost of the kernel's own instructions for a row with the memory
traffic gone (the slope cancels the per-call costs). A forward of S rows can be no faster than S rows of
instructions nor than streaming its weights once (the S = 1 time from DRAM), so the instruction-throughput
floor of the path that runs (SPECZOO_KERNEL_PATH picks one) is c_v(S) >= max(t_DRAM(1), S r) / t_DRAM(1);
the report sets the measured c_v beside it.
This module must never be imported by the runtime: it is a measurement script.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from speczoo.kernels.backends import get_backend
from speczoo.kernels.pack import GROUP, STRIP, SUPER, Q8_KALIGN, q4_groups

LAYERS = 28
SHAPES: dict[str, tuple[int, int]] = {   # name -> (N, K) of W[N, K]
    "q": (1536, 1536), "k": (256, 1536), "v": (256, 1536), "o": (1536, 1536),
    "gate": (8960, 1536), "up": (8960, 1536), "down": (1536, 8960), "lm_head": (151936, 1536),
}
S_VALUES = (1, 2, 5, 9, 17)
DRAM_BYTES = 160 * 2**20   # bytes of distinct copies per shape: five times the L3
CACHED_BYTES = 2**20  # a weight slice that stays in cache across calls (--floor): L2, or L3 on small-L2 cores


@dataclass
class ShapeTiming:
    shape: str
    bytes_per_copy: int
    ms: dict[int, float] = field(default_factory=dict)   # S -> median ms per call
    best: dict[int, float] = field(default_factory=dict)  # S -> fastest pass (what an idle machine gives)


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def random_packed(backend: str, n: int, k: int, gen: torch.Generator) -> dict[str, Tensor]:
    """Packed tensors of the right layout for `backend`, filled with random values."""
    nb = _round_up(n, STRIP) // STRIP
    meta = torch.tensor([n, k], dtype=torch.int64)

    def u8(*shape: int) -> Tensor:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)

    if backend in ("q8", "q8_torch"):
        kp = _round_up(k, Q8_KALIGN)
        return {"w8": u8(nb, kp // 4, STRIP, 4), "sw": torch.rand(nb * STRIP, generator=gen) * 1e-3, "meta": meta}
    if backend in ("q4", "q4_torch"):
        g = q4_groups(k)
        kb = _round_up(g, SUPER // GROUP) // (SUPER // GROUP)
        return {"qs": u8(nb, g, 4, STRIP, 4), "sc": u8(nb, g, STRIP) // 4,
                "mn": u8(nb, g // 2, STRIP, 2) // 4, "dd": torch.rand(nb, kb, 2, STRIP, generator=gen) * 1e-4,
                "meta": meta}
    return get_backend(backend).pack(torch.randn(n, k, generator=gen) * 0.02)


def _bytes(packed: dict[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for name, t in packed.items() if name != "meta")


def _clock(kind: str):
    """wall: time.perf_counter. cpu: this process's CPU seconds / threads, which ignores the time a loaded
    machine keeps our threads off the cores (run it with OMP_WAIT_POLICY=passive so that idle threads
    do not spin into the count); it estimates the idle-machine wall time of compute-bound calls."""
    if kind == "wall":
        return time.perf_counter
    threads = torch.get_num_threads()
    return lambda: time.process_time() / threads


def time_shape(backend: str, shape: str, reps: int, s_values: tuple[int, ...], gen: torch.Generator,
               clock=time.perf_counter) -> ShapeTiming:
    n, k = SHAPES[shape]
    first = random_packed(backend, n, k, gen)
    per_copy = _bytes(first)
    copies = max(1, min(64, -(-DRAM_BYTES // per_copy)))
    be = get_backend(backend)
    mods: list[nn.Module] = [be.build(first, None)]
    mods += [be.build(random_packed(backend, n, k, gen), None) for _ in range(copies - 1)]
    out = ShapeTiming(shape, per_copy)
    for s in s_values:
        x = torch.randn(s, k, generator=gen)   # [S, K]
        for m in mods:                         # warm-up pass
            m(x)
        samples = []
        for _ in range(reps):
            t0 = clock()
            for m in mods:
                m(x)
            samples.append((clock() - t0) * 1e3 / len(mods))
        out.ms[s] = statistics.median(samples)
        out.best[s] = min(samples)
    del mods
    return out


def time_shape_cached(backend: str, shape: str, reps: int, s_values: tuple[int, ...], gen: torch.Generator,
                      clock=time.perf_counter) -> ShapeTiming:
    """The shape's time with its weights in cache: a slice of whole strips that fits CACHED_BYTES, called
    enough times per sample to take ~20 ms, scaled by N / slice."""
    n, k = SHAPES[shape]
    per_row = _bytes(random_packed(backend, STRIP, k, gen)) / STRIP
    n_sub = max(STRIP, min(n, int(CACHED_BYTES // per_row) // STRIP * STRIP))
    mod = get_backend(backend).build(random_packed(backend, n_sub, k, gen), None)
    out = ShapeTiming(shape, int(per_row * n))
    for s in s_values:
        x = torch.randn(s, k, generator=gen)
        t0 = clock()
        calls = 0
        while clock() - t0 < 0.02 or calls < 5:   # warm-up, and how many calls make ~20 ms
            mod(x)
            calls += 1
        samples = []
        for _ in range(reps):
            t0 = clock()
            for _ in range(calls):
                mod(x)
            samples.append((clock() - t0) * 1e3 / calls * n / n_sub)
        out.ms[s] = statistics.median(samples)
        out.best[s] = min(samples)
    return out


def floor_report(dram: dict[str, ShapeTiming], cached: dict[str, ShapeTiming], s_values: tuple[int, ...]) -> str:
    """Measured c_v(S) of the whole model's linears beside the path's floor max(t_DRAM(1), S r) / t_DRAM(1)."""
    first, last = s_values[0], s_values[-1]
    base = model_ms(dram, first)
    per_row = (model_ms(cached, last) - model_ms(cached, first)) / (last - first)
    cells = []
    for s in s_values[1:]:
        floor = max(base, s * per_row) / base
        measured = model_ms(dram, s) / base
        cells.append(f"S={s}: c_v {measured:.2f}, floor {floor:.2f} ({measured / floor:.2f}x the floor)")
    return f"   [floor] instructions per row, weights in cache: {per_row:.2f} ms; " + "; ".join(cells)


def model_ms(timings: dict[str, ShapeTiming], s: int, stat: str = "ms") -> float:
    layer = sum(getattr(timings[name], stat)[s] for name in SHAPES if name != "lm_head")
    return LAYERS * layer + getattr(timings["lm_head"], stat)[s]


def model_bytes(timings: dict[str, ShapeTiming]) -> int:
    layer = sum(timings[name].bytes_per_copy for name in SHAPES if name != "lm_head")
    return LAYERS * layer + timings["lm_head"].bytes_per_copy


def report(backend: str, timings: dict[str, ShapeTiming], s_values: tuple[int, ...]) -> str:
    lines = [f"== {backend}  (threads={torch.get_num_threads()})",
             f"{'shape':>8} {'N x K':>13} " + " ".join(f"{'S=' + str(s):>8}" for s in s_values)
             + f" {'GB/s@1':>7} " + " ".join(f"{'cv' + str(s):>5}" for s in s_values[1:])]
    for name, t in timings.items():
        n, k = SHAPES[name]
        gbs = t.bytes_per_copy / (t.ms[s_values[0]] * 1e-3) / 1e9
        lines.append(f"{name:>8} {f'{n}x{k}':>13} " + " ".join(f"{t.ms[s]:8.3f}" for s in s_values)
                     + f" {gbs:7.1f} " + " ".join(f"{t.ms[s] / t.ms[s_values[0]]:5.2f}" for s in s_values[1:]))
    for stat, label in (("ms", "model"), ("best", "best")):
        tot = {s: model_ms(timings, s, stat) for s in s_values}
        base = tot[s_values[0]]
        gbs = model_bytes(timings) / (base * 1e-3) / 1e9
        lines.append(f"{label:>8} {'28L + head':>13} " + " ".join(f"{tot[s]:8.2f}" for s in s_values)
                     + f" {gbs:7.1f} " + " ".join(f"{tot[s] / base:5.2f}" for s in s_values[1:]))
        lines.append(f"   [{'median' if stat == 'ms' else 'fastest pass'}] weights {model_bytes(timings) / 1e9:.3f} GB/token; "
                     f"estimated decode (linear layers only) {1e3 / base:.1f} tok/s; c_v(S) = "
                     + ", ".join(f"{s}: {tot[s] / base:.2f}" for s in s_values))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="q4,q8,q8_torch,bf16,fp32",
                    help="comma-separated backends, timed side by side in this run")
    ap.add_argument("--reps", type=int, default=5, help="timed passes per (shape, S); the median is reported")
    ap.add_argument("--s", default=",".join(map(str, S_VALUES)), help="comma-separated S values; the first is the c_v base")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time (the real figure), or CPU time / threads (robust when other processes load the machine)")
    ap.add_argument("--threads", type=int, default=None, help="torch/kernel threads (default: torch's)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="subset of shapes (the model line needs all)")
    ap.add_argument("--floor", action="store_true",
                    help="also time the shapes with their weights in cache and report the path's c_v floor")
    args = ap.parse_args(argv)
    s_values = tuple(int(v) for v in args.s.split(","))
    if args.floor and s_values[0] == s_values[-1]:
        ap.error(f"--floor needs two S values (--s 1,9): its slope per row is taken between the first and the last "
                 f"S, and --s {args.s} gives one")
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; choose from {list(SHAPES)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = _clock(args.clock)
    gen = torch.Generator().manual_seed(0)
    for backend in args.backend.split(","):
        get_backend(backend)  # fail early on a bad name
    print(f"clock={args.clock} threads={torch.get_num_threads()} reps={args.reps}", flush=True)
    for backend in args.backend.split(","):
        timings = {name: time_shape(backend, name, args.reps, s_values, gen, clock) for name in shapes}
        if set(shapes) == set(SHAPES):
            print(report(backend, timings, s_values), flush=True)
            if args.floor:
                cached = {name: time_shape_cached(backend, name, args.reps, s_values, gen, clock) for name in shapes}
                print(floor_report(timings, cached, s_values), flush=True)
        else:
            print("\n".join(report_lines_only(backend, timings, s_values)), flush=True)
    return 0


def report_lines_only(backend: str, timings: dict[str, ShapeTiming], s_values: tuple[int, ...]) -> list[str]:
    lines = [f"== {backend}"]
    for name, t in timings.items():
        gbs = t.bytes_per_copy / (t.ms[s_values[0]] * 1e-3) / 1e9
        lines.append(f"{name:>8} " + " ".join(f"{t.ms[s]:8.3f}" for s in s_values) + f"  GB/s@1 {gbs:6.1f}  cv "
                     + " ".join(f"{t.ms[s] / t.ms[s_values[0]]:5.2f}" for s in s_values[1:]))
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
