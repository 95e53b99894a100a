"""speczoo beside llama.cpp from 0.5B to 8B: random-weight models in Llama 3's exact shapes, same file, same CPU.

    python -m benchmarks.shape_models --dir /work/shapes [--sizes 0.5b,1.5b,1b,3b,8b] [--types Q4_K_M,Q4_0]
                                      [--gen 32] [--repeats 3] [--rounds 1] [--threads 2] [--pair 8b:1b] [--k 4]
                                      [--alpha 0.7] [--fresh] [--ctx 4096] [--memory-only | --files-only] [--drop-f16]

Speed does not depend on the weights' values, so for each of Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B
this writes an F16 GGUF with random weights in the model's exact shapes and hyperparameters (arch llama,
vocabulary 128256 with Llama 3's special tokens, BOS/EOS and chat template, tied embeddings for 3.2, the
"llama3" RoPE scaling as the rope_freqs tensor llama.cpp's converter writes; benchmarks/pull_scale.py's
writer), quantizes it with llama.cpp's own `llama-quantize` to each --types, and pulls each file into a
speczoo zoo under DIR/home. The rows 0.5b and 1.5b are the real zoo models' GGUFs as downloaded (assembled
into DIR from the installed packages), pulled the same way. Then, per file, each in its own process on the
same threads:

* pull time and the pull's peak RSS (`speczoo pull`);
* greedy decode tok/s: speczoo (`speczoo bench FILE --spec ngram`: its "greedy=" side, a raw prompt) beside
  llama.cpp (`llama-bench -n GEN`); with --rounds N, N alternations of the two, and the table quotes the medians
  and the median of the rounds' ratios (a shared host's memory bandwidth moves by half within minutes);
* c_v(2/5/9): speczoo (`speczoo cv FILE --sizes 1,2,5,9`) beside llama.cpp (`llama-bench -p 2,5,9`: the
  time to process S prompt tokens over the time of one decode step, which is c_v(S));
* peak memory at one context (--ctx, default 4096), each system decoding --gen tokens of the same raw prompt in
  its own process: `speczoo generate FILE --max-seq CTX` beside `llama-completion -c CTX` (greedy, its defaults:
  the GGUF memory-mapped, f16 KV for the whole context, compute buffers for a 512-token batch). Peak is the
  RSS high-water (os.wait4's ru_maxrss), which counts a memory-mapped file's pages once touched; beside it
  the most anonymous memory (RssAnon: what the process allocated) and file-backed memory (RssFile: mapped
  files' resident pages, page cache that other processes share and the kernel can reclaim) it was seen to
  hold, sampled from /proc every 20 ms. The speczoo runtime alone (Python, PyTorch, imports) is measured
  once. Memory figures hold under load; times do not.

"The draft model at scale" (--pair TARGET:DRAFT, default 8b:1b, when both were measured): the cost model's
(speczoo.decoding.pricing.cost) best K, predicted speedup and break-even α at α 0.5-0.8 with r = draft step /
target step and the target's c_v, from speczoo's and from llama.cpp's measured figures, and a measured run at
a forced acceptance (benchmarks/forced_draft.py: the draft model's forwards are real, its tokens are the
target's own at --alpha; random weights accept nothing on their own), set beside the cost model's prediction
at the acceptance it realized, priced with the runtime's profile and with the r and c_v timed in that run.

GGUFs, bundles and measured figures (DIR/results.json; DIR/results-PATH.json when SPECZOO_KERNEL_PATH=PATH
forces a kernel path, e.g. avx2 on an AVX-512 CPU) are cached in DIR: a rerun writes, quantizes, pulls
and measures only what is missing (--fresh measures again). Needs llama.cpp's tools on --llama-bin. An 8B
size needs ~16 GB for its F16 file plus ~5 GB per type and bundle. A measurement script: never imported by
the package, never writes outside DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import forced_draft
from benchmarks.pull_scale import SHAPES, write_gguf
from speczoo.decoding.pricing.cost import CvCurve, best_k, break_even_alpha
from speczoo.kernels.native import PATH_ENV
from speczoo.zoo import bundle as B
from speczoo.zoo.registry import local_bundle_name

LLAMA_32 = dict(arch="llama", vocab=128256, kv_heads=8, ffn=8192, tied=True, rope_factor=32.0, context=131072)
SIZES = {
    "1b": ("Llama-3.2-1B", dict(LLAMA_32, layers=16, dim=2048, heads=32, head_dim=64)),
    "3b": ("Llama-3.2-3B", dict(LLAMA_32, layers=28, dim=3072, heads=24, head_dim=128)),
    "8b": ("Llama-3.1-8B", dict(SHAPES, arch="llama", rope_factor=8.0, context=131072)),
}
REAL = {"0.5b": "qwen2.5-coder-0.5b", "1.5b": "qwen2.5-coder-1.5b"}   # zoo GGUFs, as downloaded
ORDER = ["0.5b", "1.5b", "1b", "3b", "8b"]
CV_SIZES = (2, 5, 9)
ALPHAS = (0.5, 0.6, 0.7, 0.8)
PROMPT = ("Write a Python function that parses a CSV file of orders and returns the total per customer, "
          "then explain how it handles quoted fields.")
SPEC_STATS = "SPEC STATS "


def results_name(kernel_path: str | None) -> str:
    """DIR's file of measured figures: results.json, or results-PATH.json under SPECZOO_KERNEL_PATH=PATH (the
    AVX2 build forced on an AVX-512 CPU is measured beside the native one, not over it)."""
    return f"results-{kernel_path}.json" if kernel_path else "results.json"


class NotMeasured(Exception):
    """--cached-only: a figure results.json does not have."""


@dataclass
class Run:
    """A child process's output, wall time, RSS high-water (bytes) and the most anonymous and file-backed
    resident memory it was seen to hold (bytes; sampled, so a peak shorter than SAMPLE_S may be missed)."""
    out: str
    err: str
    wall: float
    peak: int
    anon: int = 0
    file: int = 0


SAMPLE_S = 0.02     # how often a child's /proc/PID/status is read for its anonymous and file-backed memory


class _Sampler(threading.Thread):
    """Reads a running process's RssAnon and RssFile (Linux /proc) every SAMPLE_S and keeps each one's
    maximum: RSS counts a memory-mapped file's pages once they are touched (llama.cpp's GGUF, speczoo's
    packing), as RssFile; what a process allocated itself is RssAnon."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.path, self.anon, self.file = Path(f"/proc/{pid}/status"), 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                fields = dict(line.split(":", 1) for line in self.path.read_text().splitlines())
            except OSError:
                return
            if "RssAnon" in fields:
                self.anon = max(self.anon, int(fields["RssAnon"].split()[0]) * 1024)
                self.file = max(self.file, int(fields["RssFile"].split()[0]) * 1024)
            self.done.wait(SAMPLE_S)


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> Run:
    """Run `cmd` to completion; its stdout, stderr, wall time, own peak RSS (wait4's ru_maxrss) and sampled
    anonymous and file-backed peaks. Raises RuntimeError with the output's tail when it fails."""
    with tempfile.TemporaryFile("w+", errors="replace") as out, tempfile.TemporaryFile("w+", errors="replace") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, text=True)
        sampler = _Sampler(proc.pid)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        sampler.done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        run = Run(out.read(), err.read(), wall, usage.ru_maxrss * 1024, sampler.anon, sampler.file)
    if proc.returncode != 0:
        tail = "\n".join((run.out + run.err).splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{tail}")
    return run


class Bench:
    """Measures one GGUF file both ways; `cache` (DIR/results.json) keeps every figure by file and step."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.home = args.dir / "home"
        self.env = {**os.environ, "SPECZOO_HOME": str(self.home)}
        self.cache_path = args.dir / results_name(os.environ.get(PATH_ENV))
        self.cache = json.loads(self.cache_path.read_text()) if self.cache_path.exists() else {}
        self.bin = args.llama_bin

    def cached(self, key: str, step: str, measure) -> dict:
        entry = self.cache.setdefault(key, {})
        if step not in entry and self.args.cached_only:
            raise NotMeasured(f"{key}: {step}")
        if step not in entry or self.args.fresh:
            entry[step] = measure()
            entry[step]["load"] = os.getloadavg()[0]
            on_disk = json.loads(self.cache_path.read_text()) if self.cache_path.exists() else {}
            on_disk.setdefault(key, {})[step] = entry[step]          # keep what a concurrent run wrote
            tmp = self.cache_path.with_suffix(f".{os.getpid()}")
            tmp.write_text(json.dumps(on_disk, indent=1))
            tmp.replace(self.cache_path)
        return entry[step]

    def speczoo(self, *argv: str) -> list[str]:
        return [sys.executable, "-m", "speczoo.cli", *argv]

    def shape_file(self, size: str, kind: str) -> Path:
        """DIR/<size>-<kind>.gguf, written (F16) and quantized by llama-quantize unless already there."""
        _, shapes = SIZES[size]
        f16 = self.args.dir / f"{size}-F16.gguf"
        out = self.args.dir / f"{size}-{kind}.gguf"
        if out.exists():
            return out
        if self.args.cached_only:
            raise NotMeasured(f"{out.name} is not written")
        if not f16.exists():
            t0 = time.perf_counter()
            tmp = f16.with_suffix(".part")
            write_gguf(tmp, "F16", shapes)
            tmp.rename(f16)
            print(f"{size}: wrote {f16} ({f16.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s",
                  flush=True)
        if kind != "F16":
            tmp = out.with_suffix(".part")
            run = run_measured([str(self.bin / "llama-quantize"), str(f16), str(tmp), kind, str(self.args.threads)])
            tmp.rename(out)
            print(f"{size}: llama-quantize {kind} in {run.wall:.0f} s ({out.stat().st_size / 1e9:.2f} GB)", flush=True)
        return out

    def pull(self, path: Path) -> dict:
        def measure() -> dict:
            run = run_measured(self.speczoo("pull", "--quiet", "--force", str(path)), self.env)
            return {"s": run.wall, "peak": run.peak}
        if not (self.home / "bundles" / local_bundle_name(path)).is_dir():
            self.cache.get(path.name, {}).pop("pull", None)
        return self.cached(path.name, "pull", measure)

    def speczoo_greedy(self, path: Path) -> dict:
        return self.cached(path.name, "speczoo_greedy", lambda: self._speczoo_decode(path))

    def _speczoo_decode(self, path: Path) -> dict:
        a = self.args
        run = run_measured(self.speczoo("bench", str(path), "--spec", "ngram", "--runs", str(a.repeats),
                                        "--gen", str(a.gen), "--prompt", PROMPT, "--raw", "--max-seq", "512",
                                        "--threads", str(a.threads)), self.env)
        return {"tok_s": _spec_stats(run.out)["greedy"], "peak": run.peak}

    def _llama_bench(self, path: Path, prompts: str) -> Run:
        """llama-bench on `path`: the prompt tests `prompts` (llama-bench's -p) and a --gen-token decode, JSON."""
        a = self.args
        return run_measured([str(self.bin / "llama-bench"), "-m", str(path), "-p", prompts, "-n", str(a.gen),
                             "-t", str(a.threads), "-r", str(a.repeats), "-o", "json"])

    def _llama_decode(self, path: Path) -> float:
        return llama_bench_figures(json.loads(self._llama_bench(path, "0").out), self.args.gen)["tok_s"]

    def decode_rounds(self, path: Path, first: tuple[float, float]) -> dict:
        """Decode tok/s of both systems over --rounds alternations (`first`, speczoo's and llama.cpp's of the
        greedy and llama steps, is round 1; each later round runs speczoo, then llama-bench -p 0): on a host
        whose memory bandwidth drifts over minutes, the median of the rounds' ratios is the figure to quote."""
        def measure() -> dict:
            sz, ll = [first[0]], [first[1]]
            for _ in range(self.args.rounds - 1):
                sz.append(self._speczoo_decode(path)["tok_s"])
                ll.append(self._llama_decode(path))
            return {"speczoo": sz, "llama": ll}
        return self.cached(path.name, f"decode_rounds{self.args.rounds}", measure)

    def speczoo_cv(self, path: Path) -> dict:
        def measure() -> dict:
            run = run_measured(self.speczoo("cv", str(path), "--sizes", ",".join(map(str, (1, *CV_SIZES))),
                                            "--json", "--repeats", str(self.args.repeats),
                                            "--threads", str(self.args.threads)), self.env)
            data = json.loads([line for line in run.out.splitlines() if line.startswith("{")][-1])
            return {"ms1": data["ms"]["1"], "cv": {int(s): c for s, c in data["cv"].items()}}
        return _int_keys(self.cached(path.name, "speczoo_cv", measure))

    def llama(self, path: Path) -> dict:
        a = self.args

        def measure() -> dict:
            run = self._llama_bench(path, ",".join(map(str, CV_SIZES)))
            return llama_bench_figures(json.loads(run.out), a.gen) | {"peak": run.peak}
        return _int_keys(self.cached(path.name, "llama", measure))

    def real_file(self, size: str) -> Path:
        """DIR/<zoo name>.gguf: the zoo model's GGUF as downloaded, assembled from its installed packages (and
        verified) unless already there."""
        from speczoo.zoo.registry import MODELS
        from speczoo.zoo.source import assemble_gguf

        out = self.args.dir / f"{REAL[size]}.gguf"
        if not out.exists():
            if self.args.cached_only:
                raise NotMeasured(f"{out.name} is not assembled")
            assemble_gguf(MODELS[REAL[size]], out)
        return out

    def baseline(self) -> dict:
        """The speczoo process before any model: Python, PyTorch and the runtime's imports."""
        def measure() -> dict:
            return _memory(run_measured([sys.executable, "-c", "import speczoo.runtime, speczoo.cli"], self.env))
        return self.cached("speczoo runtime", "memory", measure)

    def speczoo_memory(self, path: Path) -> dict:
        """`speczoo generate FILE` (greedy, raw prompt, --gen tokens) at --max-seq = the context: its memory."""
        a = self.args

        def generate(n: int) -> Run:
            return run_measured(self.speczoo("generate", str(path), "--prompt", PROMPT, "-n", str(n), "--max-seq",
                                             str(a.ctx), "--threads", str(a.threads)), self.env)

        def measure() -> dict:
            # a run that finds no valid cost profile (none stored, or one from another kernel build) times one
            # (forwards over random ids, which read embedding rows all over the table) and stores it; every
            # later run reads it, so a one-token run goes first and the run after it is measured
            generate(1)
            return _memory(generate(a.gen))
        return self.cached(path.name, f"speczoo_memory_c{a.ctx}", measure)

    def llama_memory(self, path: Path) -> dict:
        """`llama-completion -c CONTEXT` on the same prompt and --gen tokens, greedy, its defaults otherwise
        (the GGUF memory-mapped, f16 KV for the whole context): its memory."""
        a = self.args

        def measure() -> dict:
            return _memory(run_measured([str(self.bin / "llama-completion"), "-m", str(path), "-p", PROMPT,
                                         "-n", str(a.gen), "-c", str(a.ctx), "-t", str(a.threads), "--temp", "0",
                                         "-no-cnv"]))
        return self.cached(path.name, f"llama_memory_c{a.ctx}", measure)

    def bundle_gb(self, path: Path) -> float:
        return B.dir_size(self.home / "bundles" / local_bundle_name(path)) / 1e9

    def draft_run(self, target: Path, draft: Path, k: int) -> dict:
        """benchmarks.forced_draft's run of TARGET with DRAFT at K tokens a round accepted at --alpha (its JSON)."""
        a = self.args

        def measure() -> dict:
            run = run_measured([sys.executable, "-m", "benchmarks.forced_draft", str(target), str(draft), "--k", str(k),
                                "--alpha", str(a.alpha), "--gen", str(a.gen), "--runs", str(a.repeats), "--threads",
                                str(a.threads), "--prompt", PROMPT, "--json"], self.env | {"PYTHONPATH": _pythonpath()})
            return json.loads(run.out.strip().splitlines()[-1]) | {"peak": run.peak}
        return self.cached(f"{target.name}+{draft.name}", f"forced_k{k}_a{a.alpha}", measure)


def _memory(run: Run) -> dict:
    return {"peak": run.peak, "anon": run.anon, "file": run.file, "s": run.wall}


def _pythonpath() -> str:
    """The children's PYTHONPATH with this repository's root first (for `benchmarks`)."""
    return os.pathsep.join([str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])


def _int_keys(entry: dict) -> dict:
    """JSON turned the c_v dict's int keys into strings; give them back."""
    return {**entry, "cv": {int(s): c for s, c in entry["cv"].items()}}


def _spec_stats(out: str) -> dict:
    """The numbers of `speczoo bench`'s SPEC STATS line: greedy, spec (tok/s), speedup, accepted/round."""
    line = next((x for x in out.splitlines() if x.startswith(SPEC_STATS)), None)
    if line is None:
        raise RuntimeError(f"speczoo bench printed no {SPEC_STATS!r} line:\n{out[-2000:]}")
    fields = dict(f.split("=", 1) for f in line[len(SPEC_STATS):].split() if "=" in f)
    return {"greedy": float(fields["greedy"]), "spec": float(fields["spec"]),
            "speedup": float(fields["speedup"].rstrip("x")), "accepted": float(fields["accepted/round"]),
            "forwards": int(fields["forwards"])}


def llama_bench_figures(tests: list[dict], gen: int) -> dict:
    """tok/s, decode step (ms) and c_v(S) from llama-bench's JSON: the median sample of each test; c_v(S) is
    the time of its S-token prompt test over one decode step (the tg test's time / its tokens)."""
    def median_ns(t: dict) -> float:
        return statistics.median(t["samples_ns"])
    tg = next(t for t in tests if t["n_gen"] == gen and t["n_prompt"] == 0)
    step = median_ns(tg) / gen
    cv = {t["n_prompt"]: median_ns(t) / step for t in tests if t["n_gen"] == 0 and t["n_prompt"] > 0}
    return {"tok_s": 1e9 / step, "ms1": step / 1e6, "cv": {1: 1.0, **cv}}


def measure_all(bench: Bench, sizes: list[str], kinds: list[str]) -> list[dict]:
    rows = []
    timed = not bench.args.memory_only
    for size in sizes:
        for kind in (["as downloaded"] if size in REAL else kinds):
            label = REAL[size] if size in REAL else f"{SIZES[size][0]} shape"
            try:
                path = bench.real_file(size) if size in REAL else bench.shape_file(size, kind)
                print(f"{label} {kind}: pull, " + ("speczoo greedy, speczoo c_v, llama-bench, " if timed else "")
                      + f"memory at context {bench.args.ctx} ...", flush=True)
                row = dict(size=size, label=label, kind=kind, path=path, gb=path.stat().st_size / 1e9,
                           pull=bench.pull(path))
                if bench.args.files_only:
                    print(f"{label} {kind}: {path} ({row['gb']:.2f} GB), pulled in {row['pull']['s']:.0f} s", flush=True)
                    continue
                if timed:
                    row.update(greedy=bench.speczoo_greedy(path), cv=bench.speczoo_cv(path), llama=bench.llama(path))
                    if bench.args.rounds > 1:
                        row["rounds"] = bench.decode_rounds(path, (row["greedy"]["tok_s"], row["llama"]["tok_s"]))
                row.update(bundle_gb=bench.bundle_gb(path), memory=bench.speczoo_memory(path),
                           llama_memory=bench.llama_memory(path))
            except NotMeasured as missing:
                print(f"{label} {kind}: not measured yet ({missing}), left out", flush=True)
                continue
            print((table([row]) if timed else memory_table([row], bench.args.ctx)).splitlines()[-1], flush=True)
            rows.append(row)
        f16 = bench.args.dir / f"{size}-F16.gguf"
        if bench.args.drop_f16 and f16.exists() and all((bench.args.dir / f"{size}-{k}.gguf").exists() for k in kinds):
            f16.unlink()                                      # every type is quantized: free its disk
            print(f"{size}: removed {f16.name} (--drop-f16)", flush=True)
    return rows


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def memory_table(rows: list[dict], ctx: int) -> str:
    """Peak memory of both systems at one context: RSS high-water, and the most anonymous (allocated) and
    file-backed (memory-mapped files' touched pages) memory each was seen to hold."""
    head = (f"| model | type | GGUF GB | bundle GB | peak GB speczoo / llama.cpp (×) at ctx {ctx} | "
            "anonymous GB speczoo / llama.cpp | file-backed GB speczoo / llama.cpp |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        m, ll = r["memory"], r["llama_memory"]
        lines.append(f"| {r['label']} | {r['kind']} | {r['gb']:.2f} | {r['bundle_gb']:.2f} | {_gb(m['peak'])} / "
                     f"{_gb(ll['peak'])} ({m['peak'] / ll['peak']:.2f}×) | {_gb(m['anon'])} / {_gb(ll['anon'])} | "
                     f"{_gb(m['file'])} / {_gb(ll['file'])} |")
    return "\n".join(lines)


def _decode_cell(row: dict) -> str:
    """speczoo / llama.cpp decode tok/s (×): one round's, or with --rounds the medians and the median (range) of
    the rounds' ratios."""
    if "rounds" not in row:
        g, ll = row["greedy"]["tok_s"], row["llama"]["tok_s"]
        return f"{g:.2f} / {ll:.2f} ({g / ll:.2f}×)"
    sz, ll = row["rounds"]["speczoo"], row["rounds"]["llama"]
    ratios = [a / b for a, b in zip(sz, ll)]
    return (f"{statistics.median(sz):.2f} / {statistics.median(ll):.2f} (**{statistics.median(ratios):.2f}×**, "
            f"{min(ratios):.2f}–{max(ratios):.2f} over {len(ratios)} rounds)")


def _cvs(cv: dict[int, float]) -> str:
    return "/".join(f"{cv[s]:.2f}" for s in CV_SIZES)


def table(rows: list[dict]) -> str:
    head = ("| model | type | file GB | pull s | decode tok/s speczoo / llama.cpp (×) | c_v(2/5/9) speczoo | "
            "c_v(2/5/9) llama.cpp | peak GB speczoo / llama.cpp (×) | pull peak GB | load |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        g, ll = r["greedy"], r["llama"]
        lines.append(f"| {r['label']} | {r['kind']} | {r['gb']:.2f} | {r['pull']['s']:.0f} | "
                     f"{_decode_cell(r)} | {_cvs(r['cv']['cv'])} | "
                     f"{_cvs(ll['cv'])} | {g['peak'] / 1e9:.2f} / {ll['peak'] / 1e9:.2f} "
                     f"({g['peak'] / ll['peak']:.2f}×) | {r['pull']['peak'] / 1e9:.2f} | {g['load']:.0f} |")
    return "\n".join(lines)


def draft_at_scale(bench: Bench, target: dict, draft: dict, k: int, k_max: int) -> str:
    """The cost model's predicted speedup of `target` with `draft` (r and c_v as measured: speczoo's `cv`, the
    runtime's own priced profile, llama.cpp's llama-bench) at α 0.5-0.8, and a measured speczoo run with the
    draft at K = k whose acceptance is forced to --alpha (benchmarks.forced_draft)."""
    m = bench.draft_run(target["path"], draft["path"], k)
    priced = m["priced"]
    lines = [f"### {target['label']} with {draft['label']} as its draft ({target['kind']})", "",
             "| r and c_v from | r = draft step / target step | target c_v(2/5/9) | break-even α | "
             + " | ".join(f"α={a} speedup (best K)" for a in ALPHAS) + " |",
             "|---|---|---|---|" + "---|" * len(ALPHAS)]
    sides = {"speczoo cv (full-vocabulary draft step)": (draft["cv"]["ms1"] / target["cv"]["ms1"], target["cv"]["cv"]),
             "llama.cpp (llama-bench)": (draft["llama"]["ms1"] / target["llama"]["ms1"], target["llama"]["cv"])}
    for name, (r, cv) in sides.items():
        curve = CvCurve.measured(cv, source=name)
        be = break_even_alpha(curve, r, k_max)
        cells = [f"{b.speedup:.2f}× ({b.k})" for b in (best_k(a, curve, r, k_max) for a in ALPHAS)]
        lines.append(f"| {name} | {r:.3f} | {_cvs(cv)} | {'never' if be is None else f'{be:.2f}'} | "
                     + " | ".join(cells) + " |")
    lines += ["", f"Step times: target {target['cv']['ms1']:.1f} ms, draft {draft['cv']['ms1']:.1f} ms (speczoo cv); "
              f"target {target['llama']['ms1']:.1f} ms, draft {draft['llama']['ms1']:.1f} ms (llama-bench). The "
              f"runtime priced the draft at r = {priced['r']:.3f} (its reduced proposing head) and c_v({k + 1}) = "
              f"{priced['cv_k1']:.2f}.", "",
              f"Measured (`python -m benchmarks.forced_draft TARGET DRAFT --k {k} --alpha {bench.args.alpha}`: the "
              "draft's forwards real, its tokens accepted at α by a seeded coin; random weights accept nothing on "
              "their own):", "", forced_draft.report(m)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True, help="GGUFs, the zoo (DIR/home) and results.json (not the repo)")
    p.add_argument("--sizes", default=",".join(ORDER), help=f"comma-separated, of {', '.join(ORDER)}")
    p.add_argument("--types", default="Q4_K_M,Q4_0", help="llama-quantize types for the shape models")
    p.add_argument("--gen", type=int, default=32, help="decoded tokens per timing (both tools)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions (llama-bench -r, speczoo --runs/--repeats)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both tools")
    p.add_argument("--rounds", type=int, default=1,
                   help="time both systems' decode this many times, alternating; the table quotes the medians")
    p.add_argument("--pair", default="8b:1b", help="TARGET:DRAFT sizes for the draft-model section ('' for none)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round of the measured draft run")
    p.add_argument("--alpha", type=float, default=0.7,
                   help="the acceptance the measured draft run forces (benchmarks.forced_draft; default 0.7)")
    p.add_argument("--kmax", type=int, default=8, help="largest K the cost model considers")
    p.add_argument("--llama-bin", type=Path, default=Path("/work/peers/llama.cpp/build/bin"),
                   help="folder of llama-quantize and llama-bench")
    p.add_argument("--ctx", type=int, default=4096,
                   help="the context both systems hold for the memory table (speczoo --max-seq, llama.cpp -c)")
    p.add_argument("--memory-only", action="store_true",
                   help="measure pull and memory only (no decode, c_v or draft timings): the memory table")
    p.add_argument("--files-only", action="store_true",
                   help="write, quantize and pull the files (each pull timed), measure nothing else")
    p.add_argument("--drop-f16", action="store_true",
                   help="delete a shape's F16 file once each --types is quantized from it (the 8B's is 16 GB)")
    p.add_argument("--fresh", action="store_true", help="measure again what results.json already has")
    p.add_argument("--cached-only", action="store_true",
                   help="write and measure nothing: the tables of what results.json has")
    args = p.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = set(sizes) - set(ORDER)
    if unknown:
        p.error(f"unknown sizes {sorted(unknown)}; choose from {', '.join(ORDER)}")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    kinds = [t.strip() for t in args.types.split(",") if t.strip()]
    args.dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(args)
    rows = measure_all(bench, sorted(sizes, key=ORDER.index), kinds)
    if args.files_only:
        return
    print(f"\n{os.cpu_count()} CPUs, {args.threads} threads, --gen {args.gen}, --repeats {args.repeats}; "
          f"load average {os.getloadavg()[0]:.1f} now\n")
    if not args.memory_only:
        print(table(rows))
    base = bench.baseline()
    print(f"\nPeak memory at context {args.ctx}, each system in its own process decoding --gen {args.gen} tokens of "
          f"the same raw prompt (speczoo generate --max-seq {args.ctx}, llama-completion -c {args.ctx}); the speczoo "
          f"runtime alone (Python, PyTorch, imports) peaks at {_gb(base['peak'])} GB, {_gb(base['anon'])} GB of "
          "it anonymous:\n")
    print(memory_table(rows, args.ctx))
    if args.pair and not args.memory_only:
        t, d = args.pair.split(":")
        for kind in kinds:
            pair = [next((r for r in rows if r["size"] == s and r["kind"] == kind), None) for s in (t, d)]
            if None not in pair:
                try:
                    print("\n" + draft_at_scale(bench, pair[0], pair[1], args.k, args.kmax))
                except NotMeasured as missing:
                    print(f"\nthe draft run of {args.pair} is not measured yet ({missing})")


if __name__ == "__main__":
    main()
