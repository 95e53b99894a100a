"""What fading a drafter's stale price buys (Pricing.stale_half_life, decoding/pricing/calibrate.py): a live A/B in one
long-lived process, on prompts where `auto` drafts with the draft model.

    python -m benchmarks.stale_ab [--half-lives 64,inf,16] [--reps 3] [--gen 96] [--quiet 6]

A drafter is timed only when it drafts. If its price is measured in a bad moment (another process loads
the machine), the controller may stop choosing it, and without fading nothing would ever measure it
again. This reproduces that moment on purpose: each sequence starts from the stored profile (a fresh
CostMeter), runs its first request under a burst of CPU load (a second process doing matmuls on every
core: target and draft slow down together, and the draft's price is measured there), then a quiet
stretch of `--quiet` requests. The same sequence runs once per half-life (inf: no fading), arms
interleaved, then again without the burst: the control, where fading must cost nothing. Reported per
arm and setting: the median tok/s over the quiet stretch, the ratio to the first arm, the draft model's
price after the first request (in target steps per draft step), and per request the drafter whose
rounds emitted most of its tokens (D draft model, N prompt lookup, - none). At 64, a price fades back
to the profile's within about 190 target forwards: the default quiet stretch (6 requests of 96 tokens)
runs about twice that. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager


SHORT = {"draft": "D", "ngram": "N", "none": "-"}
# Built-in questions (bench/data/questions.jsonl) where prompt lookup finds little and `auto` drafts with
# the draft model on a quiet machine (docs/results.md): math and writing, alternating. The built-in demo's
# free-form story comes first, as the burst's request.
QUESTIONS = (49, 58, 50, 61, 51, 64, 52, 63)
HOG = ("import sys, torch\ntorch.set_num_threads(int(sys.argv[1]))\na = torch.randn(768, 768)\n"
       "print('ready', flush=True)\nwhile True:\n    a @ a\n")


@dataclasses.dataclass
class Sequence:
    """One arm's run: quiet-stretch tokens and seconds, per request the drafter that emitted most, and
    the draft model's price (target steps per draft step) as the meter gave it after the first request."""

    tokens: int = 0
    seconds: float = 0.0
    choices: str = ""
    priced: float = math.nan

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


@contextlib.contextmanager
def cpu_burst(threads: int) -> Iterator[subprocess.Popen]:
    """A second process doing matmuls on `threads` threads for as long as the block runs."""
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(threads)], stdout=subprocess.PIPE, text=True)
    try:
        if hog.stdout is None or hog.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the CPU hog did not start (exit status {hog.poll()}); is torch importable?")
        yield hog
    finally:
        hog.terminate()
        hog.wait()


def run_sequence(engine, prompts: list[list[int]], gen: int, half_life: float,
                 burst: Callable[[], AbstractContextManager] | None) -> Sequence:
    """One arm: a fresh meter, the first request under `burst` (when given), the rest timed as the quiet
    stretch, all with `auto` and the meter's Pricing.stale_half_life set to `half_life` (the engine's
    shipped Pricing is restored after)."""
    from speczoo.decoding.round import Finished, Round
    from speczoo.request import GenerationRequest

    engine.costs = dataclasses.replace(engine.costs)      # a new profile object: a fresh meter
    shipped, engine.pricing = engine.pricing, dataclasses.replace(engine.pricing, stale_half_life=half_life)
    seq = Sequence()
    try:
        for i, ids in enumerate(prompts):
            used: Counter[str] = Counter()
            with burst() if burst is not None and i == 0 else contextlib.nullcontext():
                for ev in engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=gen, spec="auto")):
                    if isinstance(ev, Round):
                        used[ev.drafter] += len(ev.ids)
                    elif isinstance(ev, Finished) and i > 0:
                        seq.tokens += ev.stats.new_tokens
                        seq.seconds += ev.stats.seconds
            seq.choices += SHORT.get(used.most_common(1)[0][0], "?") if used else "."
            if i == 0:
                seq.priced = engine.meter.costs().draft_cost.get("draft", math.nan)
    finally:
        engine.pricing = shipped
    return seq


def measure(engine, prompts: list[list[int]], gen: int, half_lives: list[float], reps: int,
            burst: Callable[[], AbstractContextManager]) -> dict[tuple[str, float], list[Sequence]]:
    """(setting, half-life) -> one Sequence per repetition; arms interleaved within each repetition."""
    out: dict[tuple[str, float], list[Sequence]] = {}
    for _ in range(reps):
        for setting, b in (("burst", burst), ("control", None)):
            for hl in half_lives:
                seq = run_sequence(engine, prompts, gen, hl, b)
                out.setdefault((setting, hl), []).append(seq)
                print(f"  {setting} {hl:g}: {seq.tok_s:.2f} tok/s, {seq.choices}", file=sys.stderr, flush=True)
    return out


def table(results: dict[tuple[str, float], list[Sequence]], half_lives: list[float]) -> list[str]:
    """One line per setting and arm: median quiet tok/s, its ratio to the first arm's, the median price of
    a draft step after the first request, and the drafters per repetition."""
    lines = []
    for setting in ("burst", "control"):
        first = statistics.median(s.tok_s for s in results[(setting, half_lives[0])])
        for hl in half_lives:
            runs = results[(setting, hl)]
            med = statistics.median(s.tok_s for s in runs)
            priced = statistics.median(s.priced for s in runs)
            lines.append(f"{setting:8s} half-life {hl:>5g}: quiet {med:6.2f} tok/s  ratio {med / first:.3f}"
                         f"  draft priced {priced:.2f}  drafters {' '.join(s.choices for s in runs)}")
    return lines


def prompts_of(rt, n: int) -> list[list[int]]:
    """The built-in free-form demo prompt, then the first `n` of QUESTIONS, as chat ids."""
    from speczoo.bench.prompts import builtin_prompt
    from speczoo.bench.questions import builtin_questions

    by_id = {q.question_id: q for q in builtin_questions()}
    messages = [builtin_prompt("free_form").message] + [by_id[i].turns[0] for i in QUESTIONS[:n]]
    return [rt.chat_ids([{"role": "user", "content": m}]) for m in messages]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--half-lives", default="64,inf,16",
                    help="target forwards; the first is the reference (64 as shipped), inf: no fading")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gen", type=int, default=96, help="tokens per request")
    ap.add_argument("--quiet", type=int, default=6, help=f"requests after the burst (at most {len(QUESTIONS)})")
    ap.add_argument("--hog-threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    if not 1 <= args.quiet <= len(QUESTIONS):
        ap.error(f"--quiet must be in 1..{len(QUESTIONS)}")
    half_lives = [float(x) if x != "inf" else math.inf for x in args.half_lives.split(",")]
    from speczoo.runtime import load_runtime

    rt = load_runtime("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    results = measure(rt.engine, prompts_of(rt, args.quiet), args.gen, half_lives, args.reps,
                      lambda: cpu_burst(args.hog_threads))
    print("\n".join(table(results, half_lives)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
