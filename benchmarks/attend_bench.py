"""Time one decode step's attention (the compiled `attend`) on synthetic fp16 caches: ms per call, GB/s.

    python -m benchmarks.attend_bench [--n 1024,16384] [--s 1,9] [--threads 1,2] [--G 4] [--hkv 8] [--dh 128]
                                      [--reps 5]

One call is one layer of a Llama-3.1-8B-shaped decode step by default: one query row (S = 1), H = G * Hkv
q-heads over Hkv kv-heads of Dh, n keys of an fp16 KV cache. The call cycles through enough distinct
caches (at least 128 MiB of K and V in all) that each call streams its keys and values from DRAM, not
from the 32 MiB L3, as the 32 layers of a real step do. Cache values are random (the kernel's speed does
not depend on them). Reports the median of --reps timed passes after one warm-up pass, and the K/V bytes
a call reads over its time. To compare two trees, run this file with PYTHONPATH pointing at each tree's src.
This module must never be imported by the runtime: it is a measurement script.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from speczoo.kernels.attention import KeyRows, Plan, attend

STREAM_BYTES = 128 << 20   # K + V bytes cycled through, above the L3
PASS_SECONDS = 0.3         # a timed pass lasts at least this long


def time_attend(n: int, g: int, hkv: int, dh: int, threads: int, reps: int, s: int = 1) -> float:
    """Median ms per attend call over `reps` passes: n keys of an fp16 cache, then the s rows of a verify's
    chain (row i sees the n keys and the chain's first i + 1 rows, as a forward of s rows after n writes
    them)."""
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    per_layer = 2 * hkv * (n + s) * dh * 2
    copies = max(1, math.ceil(STREAM_BYTES / per_layer))
    caches = [(torch.randn(hkv, n + s, dh, generator=gen).half(), torch.randn(hkv, n + s, dh, generator=gen).half())
              for _ in range(copies)]                                  # [Hkv, n + s, Dh] each
    q = torch.randn(s, g * hkv, dh, generator=gen) / math.sqrt(dh)     # [S, H, Dh]
    plan = Plan(KeyRows.from_rows([(0, n + i + 1) for i in range(s)]))
    calls = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < PASS_SECONDS or calls < copies:  # warm-up; sizes a pass
        k, v = caches[calls % copies]
        attend(q, k, v, plan)
        calls += 1
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(calls):
            k, v = caches[i % copies]
            attend(q, k, v, plan)
        times.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1024,16384", help="key counts, comma-separated")
    ap.add_argument("--s", default="1", help="query rows (a verify's chain of S), comma-separated")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--G", type=int, default=4, help="q-heads per kv-head")
    ap.add_argument("--hkv", type=int, default=8, help="kv-heads")
    ap.add_argument("--dh", type=int, default=128, help="head size")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"attend, G={args.G}, Hkv={args.hkv}, Dh={args.dh}, fp16 cache; median of {args.reps} passes")
    for n in (int(x) for x in args.n.split(",")):
        for s in (int(x) for x in args.s.split(",")):
            for t in (int(x) for x in args.threads.split(",")):
                ms = time_attend(n, args.G, args.hkv, args.dh, t, args.reps, s)
                gbs = 2 * args.hkv * n * args.dh * 2 / ms / 1e6
                print(f"n={n:6d} S={s:2d} threads={t}  {ms:8.3f} ms/call  {ms / s:7.3f} ms/row  "
                      f"{gbs:6.1f} GB/s of K/V")


if __name__ == "__main__":
    main()
