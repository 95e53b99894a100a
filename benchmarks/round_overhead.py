"""What a round costs outside the target's forward, in target decode steps: the controller's
`round_overhead` (decoding/pricing/cost.py), measured.

    python -m benchmarks.round_overhead [--model qwen2.5-coder-1.5b] [--specs off,ngram] [--gen 96]

For each built-in demo prompt and mode: the decode time the engine reports, less the time spent inside
the target's forward (timed around it), per round, over the profile's decode step. The runtime loads no
draft model, so the only forwards timed are the target's. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import time


def measure(model_name: str, specs: list[str], gen: int) -> list[tuple[str, str, int, float, float]]:
    """(spec, prompt, rounds, ms per round outside the forward, the same in target steps) per run."""
    from speczoo.bench.prompts import BUILTIN_PROMPTS
    from speczoo.request import GenerationRequest
    from speczoo.runtime import load_runtime

    rt = load_runtime(model_name)
    target = rt.engine.target
    inside: list[float] = []
    forward = target.forward

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = forward(*args, **kwargs)
        inside.append(time.perf_counter() - t)
        return out

    target.forward = timed
    step_ms = rt.engine.costs.step_ms
    rows = []
    for spec in specs:
        for p in BUILTIN_PROMPTS:
            ids = rt.chat_ids([{"role": "user", "content": p.message}])
            inside.clear()
            *_, done = rt.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=gen, spec=spec))
            st = done.stats
            outside_ms = (st.seconds - sum(inside[1:])) / st.rounds * 1e3      # inside[0]: the prefill
            rows.append((spec, p.name, st.rounds, outside_ms, outside_ms / step_ms))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--specs", default="off,ngram")
    ap.add_argument("--gen", type=int, default=96)
    args = ap.parse_args(argv)
    for spec, name, rounds, ms, steps in measure(args.model, args.specs.split(","), args.gen):
        print(f"{spec:6s} {name:14s} rounds {rounds:3d}  outside the forward {ms:.2f} ms/round = {steps:.4f} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
