"""Where a speculative mode's time goes, live: each round timed and priced in greedy steps of the same turn.

    python -m benchmarks.round_costs [TARGET] [--draft NAME] [--categories writing,translation] [--limit 2]
                                     [--gen 256] [--methods draft,ngram,auto] [--k 8]

Each turn of the suite's questions runs greedily first, then in each method (their order alternating turn by
turn); a round's wall time (from the event before it to its own) is divided by the greedy run's seconds per
token of that same turn, measured seconds before. So rounds are priced in steps of the machine's speed of
that minute: its drift between minutes (how far it goes: docs/results.md) cancels, where tok/s of runs
minutes apart would rank the methods by the minute each ran in. Per method it prints the tokens per greedy
step overall (its speedup, the geometric mean over turns) and per kind of round (its drafter and how many
tokens it drafted): rounds, steps a round, tokens a round, tokens a step. A kind under 1.0 token a step loses
to plain decoding wherever it is chosen.
The first round of a turn carries the prefill and is left out of the kinds; the suite's settings otherwise
(each method drafts from the suffix memory of its own answers; later turns follow the greedy answers).
This module must never be imported by the runtime: it is a measurement script.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PLAIN = "none"


@dataclass
class Kind:
    """The rounds of one kind (drafter, tokens drafted): their count, greedy steps and tokens."""
    rounds: int = 0
    steps: list[float] = field(default_factory=list)
    tokens: int = 0

    def add(self, steps: float, tokens: int) -> None:
        self.rounds += 1
        self.steps.append(steps)
        self.tokens += tokens

    def merge(self, other: "Kind") -> None:
        """Adds another kind's rounds to these (a drafter's total over its kinds)."""
        self.rounds += other.rounds
        self.steps += other.steps
        self.tokens += other.tokens

    @property
    def per_step(self) -> float:
        return self.tokens / sum(self.steps) if sum(self.steps) > 0 else math.inf


@dataclass
class Turn:
    """One generation: its streamed rounds (drafter, drafted, seconds, tokens) after the first, its totals and
    its text."""
    rounds: list[tuple[str, int, float, int]]
    tokens: int
    seconds: float
    text: str


def timed(events: Iterable, clock: Callable[[], float] = time.perf_counter) -> Turn:
    """A generation's events timed as they arrive: each round's seconds since the event before it (the first
    round, which carries the prefill, only starts the clock); the totals from its DoneEvent's stats."""
    from speczoo.events import DoneEvent

    rounds: list[tuple[str, int, float, int]] = []
    last = None
    for ev in events:
        now = clock()
        if isinstance(ev, DoneEvent):
            return Turn(rounds, ev.stats.new_tokens, ev.stats.seconds, ev.text)
        if last is not None:
            rounds.append((ev.drafter or PLAIN, ev.drafted, now - last, len(ev.ids)))
        last = now
    raise RuntimeError("the generation ended without a DoneEvent")


def price(turn: Turn, greedy: Turn, kinds: dict[tuple[str, int], Kind]) -> float:
    """Add the turn's rounds to `kinds` in steps of the greedy turn (its seconds per token); return the turn's
    tokens per greedy step (its speedup over that greedy run)."""
    step = greedy.seconds / greedy.tokens
    for drafter, drafted, seconds, tokens in turn.rounds:
        kinds.setdefault((drafter, drafted), Kind()).add(seconds / step, tokens)
    return (turn.tokens / turn.seconds) * step


def report(method: str, speedups: list[float], kinds: dict[tuple[str, int], Kind]) -> list[str]:
    """A method's lines: the geometric mean speedup over its turns, then one line per kind of round and one
    per drafter."""
    geo = math.exp(sum(map(math.log, speedups)) / len(speedups))
    lines = [f"== {method}: {geo:.3f} tokens per greedy step (geometric mean over {len(speedups)} turns)"]
    drafters: dict[str, Kind] = {}
    for (drafter, drafted), k in sorted(kinds.items()):
        lines.append(f"  {drafter:10s} drafted {drafted:2d}: {k.rounds:5d} rounds, "
                     f"{statistics.median(k.steps):5.2f} steps a round (median), "
                     f"{k.tokens / k.rounds:5.2f} tokens a round, {k.per_step:5.2f} tokens a step")
        drafters.setdefault(drafter, Kind()).merge(k)
    for drafter, d in drafters.items():
        lines.append(f"  {drafter:10s} all       : {d.rounds:5d} rounds, {sum(d.steps):7.1f} steps, "
                     f"{d.tokens:5d} tokens, {d.per_step:5.2f} tokens a step")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", default="qwen2.5-coder-1.5b", help="zoo name of the target")
    ap.add_argument("--draft", help="draft model (default: the zoo's draft of the target)")
    ap.add_argument("--categories", default="writing,translation", help="the suite's categories to run")
    ap.add_argument("--limit", type=int, default=2, help="questions per category")
    ap.add_argument("--gen", type=int, default=256, help="new tokens per turn")
    ap.add_argument("--methods", default="draft,ngram,auto", help="speculative modes, each priced against off")
    ap.add_argument("--k", type=int, default=8, help="the most draft tokens per round")
    args = ap.parse_args(argv)
    if args.limit < 1 or args.gen < 2 or args.k < 1:
        raise SystemExit("--limit and --k must be >= 1, --gen >= 2")
    methods = [m for m in args.methods.split(",") if m]
    if not methods or "off" in methods:
        raise SystemExit("--methods: speculative modes only (each is priced against off, which always runs)")

    from speczoo.bench.questions import builtin_questions, select
    from speczoo.bench.suite import turn_ids
    from speczoo.commands.suite import draft_to_load
    from speczoo.request import GenerationRequest
    from speczoo.runtime import load_runtime

    rt = load_runtime(args.target, draft=draft_to_load(args.target, methods, args.draft))
    questions = select(builtin_questions(), categories=args.categories.split(","), limit=args.limit)

    def run(ids: list[int], method: str):
        return rt.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=args.gen, spec=method, k=args.k,
                                             tenant=f"round_costs:{method}"))

    speedups: dict[str, list[float]] = {m: [] for m in methods}
    kinds: dict[str, dict[tuple[str, int], Kind]] = {m: {} for m in methods}
    n = 0
    for q in questions:
        answers: list[str] = []
        for _ in q.turns:
            ids = turn_ids(rt.tokenizer, q, answers)
            greedy = timed(run(ids, "off"))
            for m in (methods if n % 2 == 0 else methods[::-1]):
                speedups[m].append(price(timed(run(ids, m)), greedy, kinds[m]))
            answers.append(greedy.text)
            n += 1
        print(f"{q.category}-{q.question_id}: " + ", ".join(f"{m} {speedups[m][-1]:.2f}x" for m in methods),
              flush=True)
    for m in methods:
        print("\n".join(report(m, speedups[m], kinds[m])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
