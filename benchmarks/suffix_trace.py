"""A coding agent's multi-turn trace, replayed through the runtime: what the suffix drafter's memory buys.

    python -m benchmarks.suffix_trace [TARGET] [--file PATH] [--modes suffix,ngram,auto] [--gen 512]

The trace is built at run time from a real file (default: src/speczoo/decoding/policy.py): each turn is a
fresh request, as an agent sends it, that re-sends the file and asks for one edit and the whole updated
file back; the next turn re-sends the model's version (its code block, or the file as it was when the
answer has none). One turn repeats an earlier one word for word (an agent retrying after a failed tool
call). Greedy (`off`) runs the trace first, timed, and fixes every turn's prompt (the retried turn costs it
what its first run did); each mode then replays the same prompts under a tenant of its own (so its memory
starts empty and holds only its own earlier answers). Reported per turn as it ends, then per mode:
accepted draft tokens per round, decode tok/s over the whole trace, and the speedup over `off` and over
`ngram`. Lossless: every mode's ids equal greedy's, turn by turn. One pass: on a machine whose speed
drifts, compare the modes' ratios with care (docs/results.md says under what load they were taken).
A measurement script, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import re
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
    rounds: int                 # greedy's run of it: rounds (= its tokens) and decode seconds
    seconds: float


@dataclass
class Totals:
    """One mode over the trace: rounds, accepted draft tokens, new tokens, decode seconds, lossless."""
    rounds: int = 0
    accepted: int = 0
    tokens: int = 0
    seconds: float = 0.0
    lossless: bool = True

    def add(self, rounds: int, accepted: int, tokens: int, seconds: float) -> None:
        self.rounds, self.accepted = self.rounds + rounds, self.accepted + accepted
        self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def build_trace(runtime, source: str, gen: int) -> list[Turn]:
    """Greedy (`off`) over the chain of edits, timed: each turn's prompt re-sends the file as the previous
    answer left it. A retried turn is the same request again and costs what its first run did."""
    turns, text, asked = [], source, {}
    for edit in EDITS:
        if edit in asked:                                  # a retry: the very same request again
            turns.append(turns[asked[edit]])
            continue
        msg = f"Here is a file:\n```python\n{text}```\n{edit} {ASK}"
        ids = runtime.chat_ids([{"role": "user", "content": msg}])
        done = run_request(runtime, GenerationRequest(prompt_ids=ids, max_new_tokens=gen, spec="off"))
        asked[edit] = len(turns)
        turns.append(Turn(ids, done.ids, done.stats.rounds, done.stats.seconds))
        print(f"off    turn {len(turns)}: {len(ids)} prompt ids, {len(done.ids)} new, {done.stats.tok_s:.2f} tok/s",
              flush=True)
        found = FENCE.search(done.text)
        text = found.group(1) if found else text
    return turns


def replay(runtime, turns: list[Turn], mode: str, tenant: str, gen: int) -> Totals:
    """The trace under `mode`, turn by turn (each line printed as it ends)."""
    total = Totals()
    for i, t in enumerate(turns, 1):
        done = run_request(runtime, GenerationRequest(prompt_ids=t.prompt_ids, max_new_tokens=gen, spec=mode,
                                                      tenant=tenant))
        total.lossless &= done.ids == t.ids
        s = done.stats
        total.add(s.rounds, s.accepted, s.new_tokens, s.seconds)
        print(f"{mode:6} turn {i}: {s.accepted_per_round:.2f} accepted/round, {s.tok_s:.2f} tok/s "
              f"({t.seconds / s.seconds:.2f}x off), lossless {done.ids == t.ids}", flush=True)
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", nargs="?", default="qwen2.5-coder-0.5b")
    ap.add_argument("--file", default=str(Path(__file__).resolve().parents[1] / "src/speczoo/decoding/policy.py"))
    ap.add_argument("--modes", default="suffix,ngram,auto")
    ap.add_argument("--gen", type=int, default=512, help="max new tokens per turn")
    args = ap.parse_args(argv)
    from speczoo.runtime import load_runtime

    runtime = load_runtime(args.target, max_seq=4096, remeasure_costs=True)
    turns = build_trace(runtime, Path(args.file).read_text(encoding="utf-8"), args.gen)
    off = Totals(rounds=sum(t.rounds for t in turns), tokens=sum(len(t.ids) for t in turns),
                 seconds=sum(t.seconds for t in turns))
    results = {"off": off, **{m: replay(runtime, turns, m, m, args.gen) for m in args.modes.split(",")}}
    print(f"trace: {len(turns)} turns, prompts {[len(t.prompt_ids) for t in turns]} ids, "
          f"answers {[len(t.ids) for t in turns]} ids; target {args.target}")
    print(f"{'mode':8} {'acc/round':>9} {'tok/s':>7} {'vs off':>7} {'vs ngram':>8} lossless")
    for mode, r in results.items():
        vs_ngram = r.tok_s / results["ngram"].tok_s if "ngram" in results else float("nan")
        print(f"{mode:8} {r.accepted / r.rounds:9.2f} {r.tok_s:7.2f} {r.tok_s / off.tok_s:6.2f}x {vs_ngram:7.2f}x "
              f"{r.lossless}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
