"""A coding agent's multi-turn trace, replayed through the runtime: what the suffix drafter's memory buys.

    python -m benchmarks.suffix_trace [TARGET] [--file PATH] [--modes ngram,suffix,auto] [--reps 1]

The trace is built at run time from a real file (default: src/speczoo/decoding/policy.py): each turn is a
fresh request, as an agent sends it, that re-sends the file and asks for one edit and the whole updated
file back; the next turn re-sends the model's version (its code block, or the file as it was when the
answer has none). One turn repeats an earlier one word for word (an agent retrying after a failed tool
call). Greedy (`off`) runs the trace first and fixes every turn's prompt; each mode then replays the same
prompts under a tenant of its own (so its memory starts empty and holds only its own earlier answers), in
a rotating order per repetition. Reported per mode: accepted draft tokens per round, decode tok/s over
the whole trace, and the speedup over `off` and over `ngram` (the medians over repetitions of the ratio
within a repetition). Lossless: every mode's ids equal greedy's, turn by turn.
A measurement script, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from speczoo.bench.ab import run_request
from speczoo.request import GenerationRequest

EDITS = (
    "Add a module-level constant VERSION = 1 right after the imports.",
    "Add a one-line comment above every function saying what it returns.",
    "Rename the parameter `costs` to `prices` everywhere in the file.",
    "Add a one-line comment above every function saying what it returns.",     # the agent retries turn 2
    "Remove the constant VERSION again.",
)
ASK = "Reply with the complete updated file in one ```python code block, and nothing else."
FENCE = re.compile(r"```(?:python)?\n(.*?)```", re.S)


@dataclass
class Turn:
    prompt_ids: list[int]
    ids: list[int]              # greedy's answer


def build_trace(runtime, source: str, gen: int) -> list[Turn]:
    """Greedy over the chain of edits: each turn's prompt re-sends the file as the previous answer left it."""
    turns, text, asked = [], source, {}
    for edit in EDITS:
        if edit in asked:                                  # a retry: the very same request again
            turns.append(Turn(turns[asked[edit]].prompt_ids, turns[asked[edit]].ids))
            continue
        msg = f"Here is a file:\n```python\n{text}```\n{edit} {ASK}"
        ids = runtime.chat_ids([{"role": "user", "content": msg}])
        done = run_request(runtime, GenerationRequest(prompt_ids=ids, max_new_tokens=gen, spec="off"))
        asked[edit] = len(turns)
        turns.append(Turn(ids, done.ids))
        found = FENCE.search(done.text)
        text = found.group(1) if found else text
    return turns


def replay(runtime, turns: list[Turn], mode: str, tenant: str, gen: int) -> tuple[float, float, bool]:
    """The trace under `mode`: (accepted per round, decode tok/s, lossless)."""
    rounds = accepted = tokens = 0
    seconds, lossless = 0.0, True
    for t in turns:
        done = run_request(runtime, GenerationRequest(prompt_ids=t.prompt_ids, max_new_tokens=gen, spec=mode,
                                                      tenant=tenant))
        lossless &= done.ids == t.ids
        s = done.stats
        rounds, accepted, tokens, seconds = rounds + s.rounds, accepted + s.accepted, tokens + s.new_tokens, \
            seconds + s.seconds
    return accepted / max(rounds, 1), tokens / seconds, lossless


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", nargs="?", default="qwen2.5-coder-0.5b")
    ap.add_argument("--file", default=str(Path(__file__).resolve().parents[1] / "src/speczoo/decoding/policy.py"))
    ap.add_argument("--modes", default="ngram,suffix,auto")
    ap.add_argument("--gen", type=int, default=512, help="max new tokens per turn")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args(argv)
    from speczoo.runtime import load_runtime

    runtime = load_runtime(args.target, max_seq=4096, remeasure_costs=True)
    turns = build_trace(runtime, Path(args.file).read_text(encoding="utf-8"), args.gen)
    print(f"trace: {len(turns)} turns, prompts {[len(t.prompt_ids) for t in turns]} ids, "
          f"answers {[len(t.ids) for t in turns]} ids; target {args.target}")
    modes = ["off", *args.modes.split(",")]
    results: dict[str, list[tuple[float, float, bool]]] = {m: [] for m in modes}
    for rep in range(args.reps):
        for mode in modes[rep % len(modes):] + modes[:rep % len(modes)]:
            results[mode].append(replay(runtime, turns, mode, f"{mode}-{rep}", args.gen))
    print(f"{'mode':8} {'acc/round':>9} {'tok/s':>7} {'vs off':>7} {'vs ngram':>8} lossless")
    for mode in modes:
        runs = results[mode]
        vs = {b: statistics.median(r[1] / o[1] for r, o in zip(runs, results[b])) if b in results else float("nan")
              for b in ("off", "ngram")}
        print(f"{mode:8} {statistics.median(r[0] for r in runs):9.2f} {statistics.median(r[1] for r in runs):7.1f} "
              f"{vs['off']:6.2f}x {vs['ngram']:7.2f}x {all(r[2] for r in runs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
