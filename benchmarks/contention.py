"""Greedy decode speed with one core taken by another program (issue #32, "never collapse under load").

    python -m benchmarks.contention [--model qwen2.5-coder-1.5b] [--tokens 32] [--runs 5]
        [--hog-cpu N] [--llama-bin /work/peers/llama.cpp/build/bin]

speczoo: the model is loaded once in this process, with the defaults a user gets (threads.py's count
and its steering, the OpenMP runtime's own wait policy), then greedy decode of --tokens tokens is timed
--runs times quiet and --runs times with a busy loop pinned to one core (a subprocess spinning in pure
Python, os.sched_setaffinity), alternating quiet and busy so that both see the same background load. Two
rows, measured one after the other within each quiet and each busy stretch: the default (the thread count
steered by the decode's own timings, speczoo/thread_pilot.py) and the same count fixed (no steering, as
`--threads N` gives). Each stretch opens with one untimed steered run, in which the steering finds the
count for the stretch (the forwards it took are printed; --no-settle times that change too), so the rows
give the speeds it settles on. The steered row also says how many threads its forwards ran on, on average.
llama.cpp (with --llama-bin): llama-bench on the same GGUF (decode only, -p 0 -n TOKENS, -t the same
count), the same way. The table gives the median of each and the ratio busy / quiet, with the load
average before and after.

This script never pins speczoo's own threads, and never leaves its busy loop running: the hog is killed
after every busy run, and on any error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

HOG_CODE = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."


@contextlib.contextmanager
def busy_core(cpu: int) -> Iterator[subprocess.Popen]:
    """A subprocess spinning on `cpu` for the duration of the block; killed and reaped after it."""
    hog = subprocess.Popen([sys.executable, "-c", HOG_CODE, str(cpu)])
    try:
        deadline = time.monotonic() + 30.0
        while True:                                     # a loaded machine starts Python slowly
            if hog.poll() is not None:
                raise RuntimeError(f"the busy loop on cpu {cpu} exited at once (status {hog.returncode})")
            if os.sched_getaffinity(hog.pid) == {cpu}:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the busy loop did not pin itself to cpu {cpu} within 30 s")
            time.sleep(0.01)
        time.sleep(0.3)  # let it spin and the scheduler see it
        yield hog
    finally:
        hog.kill()
        hog.wait()


def alternate(measures: dict[str, Callable[[], float]], runs: int, cpu: int,
              settle: Callable[[], object] | None = None) -> dict[str, tuple[list[float], list[float]]]:
    """Per measure, (quiet tok/s, busy tok/s), `runs` of each: a quiet stretch running every measure in
    turn, then a busy one, quiet, busy, ...; `settle` (untimed) opens each stretch."""
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in measures}

    def stretch(col: int) -> None:
        if settle is not None:
            settle()
        for name, measure in measures.items():
            out[name][col].append(measure())

    for _ in range(runs):
        stretch(0)
        with busy_core(cpu):
            stretch(1)
    return out


class CountingSteer:
    """The runtime's thread steering, unchanged, counting the threads each decode forward ran on."""

    def __init__(self, steer):
        self.steer = steer
        self.counts: list[int] = []

    def begin(self) -> None:
        self.steer.begin()

    def timed(self, s: int, seconds: float) -> bool:
        import torch

        self.counts.append(torch.get_num_threads())
        return self.steer.timed(s, seconds)

    def end(self) -> None:
        self.steer.end()

    def mean_since(self, start: int) -> float:
        seen = self.counts[start:]
        return sum(seen) / len(seen) if seen else float("nan")


@dataclass
class SpeczooRuns:
    """The measures of one loaded runtime: its default (steered, when the count is not fixed) and the count
    fixed; `threads` records the steered runs' mean thread count per run; `settle` is one untimed steered
    run, and `settled` the forwards each took until the count it ended on ran settled."""

    measures: dict[str, Callable[[], float]]
    threads: list[float]
    settle: Callable[[], object] | None
    settled: list[int]


def speczoo_measures(model: str, tokens: int) -> SpeczooRuns:
    """Functions that each run one greedy decode of `tokens` tokens and return its decode tok/s: the
    runtime's default steering and the count fixed, on the same loaded model."""
    import torch

    from speczoo.request import GenerationRequest
    from speczoo.runtime import load_runtime

    rt = load_runtime(model)
    ids = rt.chat_ids([{"role": "user", "content": PROMPT}])
    steer = None if rt.engine.steer is None else CountingSteer(rt.engine.steer)
    threads: list[float] = []

    def once(with_steer) -> float:
        rt.engine.steer = with_steer
        start = len(steer.counts) if steer is not None else 0
        *_, done = rt.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=tokens, spec="off"))
        if with_steer is not None:
            threads.append(steer.mean_since(start))
        return done.stats.tok_s

    settled: list[int] = []

    def settle() -> None:
        start = len(steer.counts)
        once(steer)
        threads.pop()
        seen = steer.counts[start:]
        last = next((i for i in range(len(seen) - 1, -1, -1) if seen[i] != seen[-1]), -1)
        settled.append(last + 1)

    top = torch.get_num_threads()
    measures = {f"speczoo, {top} threads fixed": lambda: once(None)}
    if steer is not None:
        measures = {f"speczoo, default (steered, 1 to {top} threads)": lambda: once(steer), **measures}
    for measure in measures.values():
        measure()  # warm up: kernels built, caches touched, the steering's first look at one thread fewer
    threads.clear()
    return SpeczooRuns(measures, threads, settle if steer is not None else None, settled)


def llama_bench_tok_s(stdout: str) -> float:
    """Decode tok/s from `llama-bench -o json` output (the one test row's avg_ts)."""
    rows = json.loads(stdout)
    gen = [r for r in rows if int(r.get("n_gen", 0)) > 0]
    if not gen:
        raise RuntimeError(f"llama-bench printed no decode row: {stdout[:300]!r}")
    return float(gen[0]["avg_ts"])


def llama_measure(bin_dir: Path, gguf: Path, tokens: int, threads: int) -> Callable[[], float]:
    """llama-bench's decode tok/s, in the same environment (the same OpenMP wait policy) as speczoo's runs."""
    exe = bin_dir / "llama-bench"
    if not exe.is_file():
        raise SystemExit(f"{exe} not found: pass the llama.cpp build/bin folder that holds llama-bench")
    if not gguf.is_file():
        raise SystemExit(f"{gguf} not found: pass the model's GGUF with --gguf")
    cmd = [str(exe), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-r", "1", "-t", str(threads), "-o", "json"]

    def once() -> float:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-800:]}")
        return llama_bench_tok_s(done.stdout)

    return once


def table(rows: list[tuple[str, list[float], list[float]]]) -> str:
    """A markdown table: engine, median quiet tok/s, median busy tok/s, ratio, and the runs themselves."""
    out = ["| | quiet tok/s | one core busy tok/s | busy / quiet | runs (quiet; busy) |", "|---|---|---|---|---|"]
    for name, quiet, busy in rows:
        q, b = statistics.median(quiet), statistics.median(busy)
        runs = f"{' '.join(f'{v:.2f}' for v in quiet)}; {' '.join(f'{v:.2f}' for v in busy)}"
        out.append(f"| {name} | {q:.2f} | {b:.2f} | {b / q:.2f}x | {runs} |")
    return "\n".join(out)


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="zoo name (default qwen2.5-coder-1.5b)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens decoded per run (default 32)")
    ap.add_argument("--runs", type=int, default=5, help="runs quiet and runs busy, alternating (default 5)")
    ap.add_argument("--hog-cpu", type=int, default=None,
                    help="the core the busy loop spins on (default: the last core this process may use)")
    ap.add_argument("--llama-bin", type=Path, default=None,
                    help="llama.cpp's build/bin folder: also measure llama-bench on the same GGUF")
    ap.add_argument("--gguf", type=Path, default=None,
                    help="the GGUF for llama-bench (default: the zoo's download of --model)")
    ap.add_argument("--skip-speczoo", action="store_true", help="measure llama.cpp only")
    ap.add_argument("--no-settle", action="store_true",
                    help="time the first run of each stretch too: the steering's change of count then counts")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.runs < 1:
        ap.error("--tokens and --runs must be at least 1")

    from speczoo import openmp_wait, paths
    from speczoo.threads import apply_threads, fixed

    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[-1] if args.hog_cpu is None else args.hog_cpu
    if cpu not in cpus:
        ap.error(f"--hog-cpu {cpu} is not one of this process's cores {cpus}")
    threads = apply_threads(None)
    steering = f"fixed by {fixed()}" if fixed() else "steered"
    print(f"cores {cpus}, busy loop on core {cpu}, {threads} threads ({steering}), {args.tokens} tokens, "
          f"{args.runs} runs each; speczoo's OpenMP wait: {openmp_wait.state()}", flush=True)
    before = load_average()
    rows = []
    if not args.skip_speczoo:
        sz = speczoo_measures(args.model, args.tokens)
        settle = None if args.no_settle else sz.settle
        rows += [(name, *runs) for name, runs in alternate(sz.measures, args.runs, cpu, settle).items()]
        print(table(rows), flush=True)
        if sz.threads:
            # each stretch runs the steered measure once: quiet, busy, quiet, busy, ...
            print(f"steered runs' mean threads per forward: quiet {' '.join(f'{t:.2f}' for t in sz.threads[::2])}; "
                  f"busy {' '.join(f'{t:.2f}' for t in sz.threads[1::2])}", flush=True)
        if sz.settled:
            print(f"forwards of each stretch's untimed first run before its last change of count: quiet "
                  f"{' '.join(map(str, sz.settled[::2]))}; busy {' '.join(map(str, sz.settled[1::2]))}", flush=True)
    if args.llama_bin is not None:
        gguf = args.gguf or paths.downloads_dir() / f"{args.model}.gguf"
        runs = alternate({"llama": llama_measure(args.llama_bin, gguf, args.tokens, threads)}, args.runs, cpu)
        rows.append((f"llama.cpp (llama-bench, -t {threads})", *runs["llama"]))
    print(flush=True)
    print(table(rows))
    print(f"\nload average (1, 5, 15 min): before {before}, after {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
