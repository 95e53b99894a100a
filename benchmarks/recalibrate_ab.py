"""What handing the controller re-calibrated costs every few rounds buys (decoding/round.py
Pricing.recalibrate_every): `auto` on the built-in demo prompts, live, with the shipped interval against
calibrating once at the first round, interleaved, median tok/s of each.

    python -m benchmarks.recalibrate_ab [--every 4] [--runs 2] [--gen 128]

Each setting starts from the stored profile (a fresh CostMeter). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

NEVER = 10**9       # calibrated costs handed over at the first round only


def measure(every: int, runs: int, gen: int) -> list[tuple[str, float, float]]:
    """(prompt, median tok/s at `every`, median tok/s calibrating once) per built-in prompt."""
    from speczoo.decoding.tuning import PRICING
    from speczoo.bench.prompts import BUILTIN_PROMPTS
    from speczoo.request import GenerationRequest
    from speczoo.runtime import load_runtime

    rt = load_runtime("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    res: dict[tuple[int, str], list[float]] = {}
    try:
        for _ in range(runs):
            for interval in (every, NEVER):
                rt.engine.pricing = dataclasses.replace(PRICING, recalibrate_every=interval)
                for p in BUILTIN_PROMPTS:
                    rt.engine.costs = dataclasses.replace(rt.engine.costs)     # a new profile object: a fresh meter
                    ids = rt.chat_ids([{"role": "user", "content": p.message}])
                    *_, done = rt.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=gen, spec="auto"))
                    res.setdefault((interval, p.name), []).append(done.stats.new_tokens / done.stats.seconds)
    finally:
        rt.engine.pricing = PRICING
    return [(p.name, statistics.median(res[(every, p.name)]), statistics.median(res[(NEVER, p.name)]))
            for p in BUILTIN_PROMPTS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=int, default=4, help="rounds between hand-overs (default 4, as shipped)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--gen", type=int, default=128)
    args = ap.parse_args(argv)
    for name, a, b in measure(args.every, args.runs, args.gen):
        print(f"{name:14s} every {args.every}: {a:6.1f} tok/s   once: {b:6.1f} tok/s   ratio {a / b:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
