"""What rolling back a hybrid model's state costs per speculative round, beside a plain KV model's.

    python -m benchmarks.hybrid_rollback [--dim 512] [--layers 8] [--ffn 2048] [--ks 4,8,16] [--backend q8]
                                         [--reps 30] [--threads N]

Two random-weight models of one shape: LFM2's layer pattern (two short-convolution layers, then one
attention layer; speczoo.models.lfm2) and the same layers all attention (Qwen3's block). Per K, over
`--reps` rounds each: the verify forward of K + 1 rows (for scale), the rollback itself (`truncate` to
base + 1 + K // 2: an integer for both, the hybrid's with its reach check), and the hybrid's extra work for
it inside the verify (planning and writing its convolution inputs, models/conv_rows.py: the per-row saved
states). Beside them, the alternative of a snapshot per verify: copying the convolution state out before the
verify and back after it, plus recomputing the K // 2 + 1 accepted rows (a forward), which per-row states
avoid. Medians in microseconds; the CPU is named; timings on a shared machine are rough.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Row:
    """One K's medians, in microseconds, over rounds timed in turn (hybrid, plain, hybrid, ...)."""

    k: int
    verify: float           # the hybrid's verify forward of K + 1 rows
    plain_verify: float     # the plain model's
    rollback: float         # the hybrid's truncate to base + 1 + K // 2 (the integer and its reach check)
    plain_rollback: float   # the plain model's truncate
    state: float            # the hybrid's convolution-input work inside its verify (plan, windows, stores)
    snapshot: float         # the snapshot alternative: the state copied out and back (twice one copy)
    recompute: float        # ... and a forward of the K // 2 + 1 accepted rows


def _us(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def _model(arch: str, dim: int, layers: int, ffn: int, vocab: int, backend: str):
    from speczoo.models.args import ModelArgs
    from speczoo.models.loader import build_model
    from speczoo.models.registry import arch_class

    conv = [i for i in range(layers) if i % 3 != 2] if arch == "lfm2" else []
    args = ModelArgs(arch=arch, vocab_size=vocab, dim=dim, n_layers=layers, n_heads=dim // 64, n_kv_heads=dim // 128,
                     head_dim=64, ffn_dim=ffn, norm_eps=1e-5, qk_norm=True, conv_layers=conv, conv_kernel=3 if conv else 0)
    g = torch.Generator().manual_seed(0)
    t = {"token_embd.weight": torch.randn(vocab, dim, generator=g) * 0.5,
         f"{arch_class(arch).OUTPUT_NORM}.weight": torch.ones(dim)}
    hd, kvd = args.n_heads * 64, args.n_kv_heads * 64
    for i in range(layers):
        p = f"blk.{i}."
        shapes = {"attn_norm": (dim,), "ffn_norm": (dim,), "ffn_gate": (ffn, dim), "ffn_up": (ffn, dim),
                  "ffn_down": (dim, ffn)}
        if i in conv:
            shapes.update({"shortconv.in_proj": (3 * dim, dim), "shortconv.conv": (dim, 3),
                           "shortconv.out_proj": (dim, dim)})
        else:
            shapes.update({"attn_q": (hd, dim), "attn_k": (kvd, dim), "attn_v": (kvd, dim), "attn_output": (dim, hd),
                           "attn_q_norm": (64,), "attn_k_norm": (64,)})
        for name, shape in shapes.items():
            t[f"{p}{name}.weight"] = (torch.ones(shape) if len(shape) == 1
                                      else torch.randn(shape, generator=g) / shape[-1] ** 0.5)
    return build_model(args, t, backend), args


def measure(dim: int, layers: int, ffn: int, ks: list[int], backend: str, reps: int,
            prompt: int = 256, vocab: int = 4096) -> list[Row]:
    from speczoo.cache import KVCache
    from speczoo.models.forward import CHAIN
    from speczoo.models.shortconv import predecessors

    hybrid, h_args = _model("lfm2", dim, layers, ffn, vocab, backend)
    plain, p_args = _model("qwen3", dim, layers, ffn, vocab, backend)
    h_cache, p_cache = (KVCache(a, prompt + 64, extra=max(ks) + 1) for a in (h_args, p_args))
    ids = torch.randint(0, vocab, (prompt + max(ks) + 1,), generator=torch.Generator().manual_seed(1))
    conv = h_cache.conv
    u = torch.randn(max(ks) + 1, dim)
    out = []
    with torch.inference_mode():
        for model, cache in ((hybrid, h_cache), (plain, p_cache)):
            model(ids[:prompt], torch.arange(prompt), cache)
        for k in ks:
            toks, pos = ids[prompt:prompt + k + 1], torch.arange(prompt, prompt + k + 1)
            keep = prompt + 1 + k // 2

            def verify(model, cache):
                cache.truncate(prompt)
                model(toks, pos, cache)

            def state_work():
                plan = conv.plan(*predecessors(CHAIN, prompt, k + 1, conv.width))
                for layer in range(len(h_args.conv_layers)):
                    conv.window(layer, u[:k + 1], plan)
                    conv.store(layer, u[:k + 1], plan)

            def recompute():
                h_cache.truncate(prompt)
                hybrid(toks[:k // 2 + 1], pos[:k // 2 + 1], h_cache)

            times: dict[str, list[float]] = {f: [] for f in Row.__dataclass_fields__ if f != "k"}
            for _ in range(reps):
                times["verify"].append(_us(lambda: verify(hybrid, h_cache)))
                times["plain_verify"].append(_us(lambda: verify(plain, p_cache)))
                times["rollback"].append(_us(lambda: h_cache.truncate(keep)))
                times["plain_rollback"].append(_us(lambda: p_cache.truncate(keep)))
                h_cache.truncate(prompt)
                times["state"].append(_us(state_work))
                times["snapshot"].append(2 * _us(lambda: conv.state(prompt)))
                times["recompute"].append(_us(recompute))
            out.append(Row(k, **{f: statistics.median(v) for f, v in times.items()}))
    return out


def cpu_name() -> str:
    """The CPU's model name and the kernel path speczoo runs on it."""
    from speczoo.kernels.native import chosen_path

    name = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} ({chosen_path().name} kernels)"


def report(rows: list[Row], args, state_bytes: int, kv_bytes: int) -> str:
    lines = [f"hybrid rollback per round: dim {args.dim}, {args.layers} layers (LFM2's pattern: 2 short convolutions "
             f"then 1 attention), ffn {args.ffn}, backend {args.backend}, {torch.get_num_threads()} threads, "
             f"{cpu_name()}; medians of {args.reps} rounds timed in turn, us (rough on a shared machine)",
             f"{'K':>3} {'verify':>8} {'plain':>8} {'rollback':>9} {'plain':>6} {'state work':>11} {'of verify':>10}"
             f" {'snapshot':>9} {'+recompute':>11} {'of verify':>10}"]
    for r in rows:
        lines.append(f"{r.k:>3} {r.verify:>8.0f} {r.plain_verify:>8.0f} {r.rollback:>9.1f} {r.plain_rollback:>6.1f} "
                     f"{r.state:>11.0f} {100 * (r.state + r.rollback) / r.verify:>9.1f}% {r.snapshot:>9.1f} "
                     f"{r.snapshot + r.recompute:>11.0f} {100 * (r.snapshot + r.recompute) / r.verify:>9.1f}%")
    lines.append(f"per sequence: the convolution rows {state_bytes / 1024:.0f} KiB, fixed; its K/V {kv_bytes / 1024:.0f} "
                 f"KiB at {args.max_seq} tokens")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--ks", default="4,8,16")
    ap.add_argument("--backend", default="q8")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-seq", type=int, default=4096, help="the context the memory line sizes the K/V for")
    ap.add_argument("--threads", type=int, default=0, help="torch and kernel threads (0: as speczoo sets them)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    rows = measure(args.dim, args.layers, args.ffn, ks, args.backend, args.reps)
    from speczoo.cache import KVCache

    cache = KVCache(_model("lfm2", args.dim, args.layers, args.ffn, 256, "fp32")[1], args.max_seq, extra=max(ks) + 1)
    print(report(rows, args, cache.conv.nbytes, cache.nbytes - cache.conv.nbytes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
