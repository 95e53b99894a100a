"""What a draft model's step costs against its target's on this machine, timed side by side.

    python -m benchmarks.draft_price [TARGET] [--draft NAME] [--context 300] [--steps 20] [--rounds 3]

Each round times, in turn and interleaved step by step so that the machine's drift lands on every figure:
the target's one-row forward alone (right after another of its own), the draft's one-row forward (through its
reduced-vocabulary head, as it drafts) alone, the same two alternating (each right after a step of the other,
as speculation runs them), and the draft's forward over S = 2, 3, 5, 9 rows (what a catch-up or prompt-lookup
guesses cost it). It prints
per round the medians in ms, the draft step in target steps (r, the price the controller's cost model puts on a
drafted token), and the draft's rows curve beside the one its stored profile holds (what sizes its guesses).
Both caches first hold --context random tokens. One process, one load; nothing is stored.
This module must never be imported by the runtime: it is a measurement script.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

ROWS = (2, 3, 5, 9)


def price_round(target, draft, steps: int) -> dict[str, float]:
    """Median ms of each kind of forward over `steps` interleaved repetitions: `target`, `draft` (one row
    each, alone), `target_between` / `draft_between` (alternating), and `rows<S>` (the draft over S rows).
    target, draft: decoding/pricing/profile.py `_Forwards` of the two models (draft's series "d": its head)."""
    times: dict[str, list[float]] = {}

    def add(kind: str, ms: float) -> None:
        times.setdefault(kind, []).append(ms)

    for _ in range(steps):
        target.time("t", 1)                              # alone: timed after a step of the same model
        add("target", target.time("t", 1))
        draft.time("d", 1)
        add("draft", draft.time("d", 1))
        add("target_between", target.time("t", 1))       # between: each after a step of the other
        add("draft_between", draft.time("d", 1))
        for s in ROWS:
            add(f"rows{s}", draft.time("d", s))
    return {kind: statistics.median(v) for kind, v in times.items()}


def describe(m: dict[str, float], stored: dict[str, float] | None) -> str:
    """One round's line: the medians, r alone and between, the draft's rows curve (and the stored one)."""
    curve = " ".join(f"c({s}) {m[f'rows{s}'] / m['draft']:.2f}" for s in ROWS)
    line = (f"target {m['target']:.1f} ms, draft {m['draft']:.1f} ms: r = {m['draft'] / m['target']:.2f}; "
            f"alternating {m['target_between']:.1f} / {m['draft_between']:.1f} ms: r = "
            f"{m['draft_between'] / m['target_between']:.2f}; draft over S rows {curve}")
    if stored:
        line += " (stored: " + " ".join(f"c({s}) {stored[str(s)]:.2f}" for s in ROWS if str(s) in stored) + ")"
    return line


def main(argv: list[str] | None = None) -> int:
    from speczoo.decoding.drafters.draft_model import reduced_head
    from speczoo.decoding.pricing.profile import Series, _Forwards, profile_path
    from speczoo.runtime import load
    from speczoo.zoo.registry import default_draft

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", default="qwen2.5-coder-1.5b", help="zoo name of the target")
    ap.add_argument("--draft", help="draft model (default: the zoo's draft of the target)")
    ap.add_argument("--context", type=int, default=300, help="random tokens in both caches first")
    ap.add_argument("--steps", type=int, default=20, help="repetitions of each forward per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each printed")
    args = ap.parse_args(argv)
    if args.context < 1 or args.steps < 1 or args.rounds < 1:
        raise SystemExit("--context, --steps and --rounds must be >= 1")
    name = args.draft or default_draft(args.target)
    if name is None:
        raise SystemExit(f"{args.target} has no draft model in the zoo: give --draft NAME")
    t, d = load(args.target), load(name)
    capacity = args.context + max(ROWS) + 1
    target = _Forwards(t.model, t.args, {"t": Series((1,))}, capacity, 0)
    draft = _Forwards(d.model, d.args, {"d": Series((1,), reduced_head(d.model))}, capacity, 0)
    path = profile_path(d)
    stored = json.loads(path.read_text()).get("draft_cv") if path.exists() else None
    print(f"{args.target} and its draft {name}, {torch.get_num_threads()} threads, context {args.context}")
    with torch.inference_mode():
        target.extend(args.context)
        draft.extend(args.context)
        for i in range(args.rounds):
            print(f"round {i + 1}: " + describe(price_round(target, draft, args.steps), stored), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
