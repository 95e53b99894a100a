"""Decode speed at long context: greedy tok/s with 1k, 8k, 16k tokens already in the KV cache, speczoo beside
llama.cpp's llama-bench on the same GGUF.

    python -m benchmarks.long_context --model qwen2.5-coder-0.5b --depths 1024,8192,16384 \
        [--kv-type f16[,f32]] [--gen 32] [--threads 2] [--llama-bin /work/peers/llama.cpp/build/bin] [--json OUT]

--model is a zoo name or a GGUF path (a shape model of benchmarks/shape_models.py: set SPECZOO_HOME to its
DIR/home, where it is pulled).

speczoo: the model is loaded as `speczoo generate` loads it (the bundle's default backend); a KV cache of
depth + gen slots in each --kv-type is filled to `depth` tokens, then `gen` single-token decode steps (one
target forward of one row over the whole cache, and its argmax) are timed. The cache is filled by a real
prefill of the first --fill tokens (default 256) of a text, whose keys and values are then repeated slot by
slot up to the depth (`--prefill` runs the whole depth through the model instead: slow on a CPU, and the
same decode speed, since a decode step's cost depends on how many keys it reads, not on their values).
llama.cpp: `llama-bench -p 0 -n GEN -d DEPTH` (its own prefill of DEPTH tokens, then GEN tokens generated;
its default f16 KV cache), with the same thread count, when --llama-bin (or $SPECZOO_LLAMA_BIN) has it.
A measurement script: never imported by the package; every figure it prints depends on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from speczoo.context import DEFAULT_KV_TYPE


@dataclass
class Row:
    engine: str      # "speczoo f16", "speczoo f32", "llama.cpp f16"
    depth: int       # tokens in the cache before the timed decode
    gen: int         # decode steps timed
    tok_s: float     # decode tokens per second


def _fill(model, cache, depth: int, fill: int, prefill: bool) -> None:
    """cache.length = depth, its slots holding the K/V of a real text (see the module docstring)."""
    g = torch.Generator().manual_seed(0)
    n = depth if prefill else min(fill, depth)
    ids = torch.randint(100, 20000, (n,), generator=g)
    with torch.inference_mode():
        for at in range(0, n, 512):                       # chunks keep the prefill's scratch small
            part = ids[at:at + 512]
            model(part, torch.arange(at, at + part.numel()), cache)
    for at in range(n, depth, n):                         # repeat the filled rows up to the depth
        m = min(n, depth - at)
        cache.copy(0, at, m)
    cache.length = depth


def speczoo_rows(name: str, depths: list[int], kv_types: list[str], gen: int, fill: int, prefill: bool,
                 log=print) -> list[Row]:
    from speczoo.cache import KVCache
    from speczoo.context import kv_dtype
    from speczoo.runtime import load

    loaded = load(name)
    rows = []
    for kv in kv_types:
        for depth in depths:
            cache = KVCache(loaded.args, depth + gen + 1, extra=0, dtype=kv_dtype(kv))
            _fill(loaded.model, cache, depth, fill, prefill)
            tok = torch.tensor([1000])
            with torch.inference_mode():
                loaded.model(tok, torch.tensor([depth]), cache)       # warm-up step (not timed)
                cache.truncate(depth)
                t0 = time.perf_counter()
                for i in range(gen):
                    logits = loaded.model(tok, torch.tensor([depth + i]), cache).logits
                    tok = logits[-1:].argmax(-1)
                dt = time.perf_counter() - t0
            rows.append(Row(f"speczoo {kv}", depth, gen, gen / dt))
            log(f"speczoo {kv} depth {depth}: {gen / dt:.2f} tok/s ({cache.nbytes / 2**20:.0f} MiB of KV)")
            del cache
    return rows


def _gguf_of(model: str) -> Path:
    if model.endswith(".gguf"):
        return Path(model)
    from speczoo.zoo.bundle import find_bundle, source_gguf
    return source_gguf(find_bundle(model))


def llama_rows(bin_dir: Path, gguf: Path, depths: list[int], gen: int, threads: int, log=print) -> list[Row]:
    exe = bin_dir / "llama-bench"
    if not exe.is_file():
        raise FileNotFoundError(f"{exe} does not exist; give --llama-bin the folder of llama.cpp's llama-bench")
    cmd = [str(exe), "-m", str(gguf), "-p", "0", "-n", str(gen), "-d", ",".join(map(str, depths)),
           "-t", str(threads), "-r", "1", "-o", "json"]
    log("llama.cpp: " + " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
    rows = []
    for r in json.loads(done.stdout):
        if r.get("n_gen", 0) > 0:
            rows.append(Row(f"llama.cpp {r.get('type_k', 'f16')}", int(r["n_depth"]), int(r["n_gen"]),
                            float(r["avg_ts"])))
            log(f"llama.cpp depth {r['n_depth']}: {float(r['avg_ts']):.2f} tok/s")
    return rows


def table(rows: list[Row], depths: list[int]) -> str:
    engines = list(dict.fromkeys(r.engine for r in rows))
    by = {(r.engine, r.depth): r.tok_s for r in rows}
    lines = ["| decode tok/s | " + " | ".join(f"{d} ctx" for d in depths) + " |",
             "|---|" + "---:|" * len(depths)]
    for e in engines:
        lines.append(f"| {e} | " + " | ".join(f"{by[(e, d)]:.2f}" if (e, d) in by else "—" for d in depths) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="a pulled zoo name (or a bundle's name)")
    p.add_argument("--depths", default="1024,8192,16384", help="tokens in the cache before decoding, comma-separated")
    p.add_argument("--kv-type", default=DEFAULT_KV_TYPE,
                   help=f"speczoo's KV element types to time, comma-separated (default {DEFAULT_KV_TYPE}, the runtime's)")
    p.add_argument("--gen", type=int, default=32, help="decode steps timed per depth (default 32)")
    p.add_argument("--fill", type=int, default=256, help="tokens really prefilled, then repeated (default 256)")
    p.add_argument("--prefill", action="store_true", help="prefill the whole depth through the model (slow)")
    p.add_argument("--threads", type=int, default=None, help="threads for both (default: torch's count)")
    p.add_argument("--llama-bin", default=os.environ.get("SPECZOO_LLAMA_BIN"),
                   help="folder of llama.cpp's llama-bench (default $SPECZOO_LLAMA_BIN; none: speczoo only)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the rows as JSON to OUT")
    a = p.parse_args(argv)
    depths = [int(d) for d in a.depths.split(",")]
    if min(depths) < 1 or a.gen < 1 or a.fill < 1:
        p.error("--depths, --gen and --fill must be positive")
    if a.threads:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    log = lambda line: print(line, file=sys.stderr, flush=True)   # noqa: E731
    log(f"load: {os.getloadavg()[0]:.2f} (1-minute average), {threads} threads")
    rows = speczoo_rows(a.model, depths, a.kv_type.split(","), a.gen, a.fill, a.prefill, log)
    if a.llama_bin:
        rows += llama_rows(Path(a.llama_bin), _gguf_of(a.model), depths, a.gen, threads, log)
    log(f"load: {os.getloadavg()[0]:.2f} (1-minute average) at the end")
    print(table(rows, depths))
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
