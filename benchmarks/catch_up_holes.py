"""What a catch-up window's hole costs the draft model's proposals: quality only, no clock.

    python -m benchmarks.catch_up_holes --replay F [--target NAME] [--draft NAME] [--lags 24,64]
                                        [--windows 0,8,16,32] [--k 5]

A draft model that sat out rounds feeds only the last `window` ids it missed (Drafting.catch_up_window): the ids
before them get no cache rows, for the rest of the answer. The offline replay (auto_replay.py) prices the bounded
catch-up but keeps the draft's recorded predictions, made with every id fed, so it cannot see what the hole costs
the proposals. This does, with the real drafter over recorded greedy answers (`auto_replay --record F`): at points
spaced through each answer, the draft is brought in sync up to `lag` ids before the point (every id fed), then
asked for `k` tokens at the point with the window under test, and its chain is judged against the recorded
output (the accepted prefix, and whether its first token is right). Holes stay in the draft's cache as they do in
a live run, so later points see the earlier ones. Window 0 feeds every id: the reference.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.auto_replay import Recording, load_recordings
from speczoo.decoding.drafters.draft_model import DraftModelDrafter


@dataclass(frozen=True)
class HoleQuality:
    """The draft's chains at one (lag, window): the mean accepted prefix (of k) and first-token hit rate."""

    lag: int
    window: int
    accepted: float
    first: float
    samples: int


def measure(drafter_for: Callable[[Recording], DraftModelDrafter], recs: Mapping[str, Recording], lag: int,
            window: int, k: int = 5) -> HoleQuality:
    """The draft's chains after missing `lag` ids and feeding the last `window` of them (0: all), at points every
    lag + 8 ids of each recording's output; drafter_for: a fresh drafter for a recording."""
    total = first = n = 0
    with torch.inference_mode():
        for rec in recs.values():
            d = drafter_for(rec)
            d.reset()
            d.prefill(rec.prompt)
            ctx, p = rec.prompt + rec.out, len(rec.prompt)
            for j in range(lag + 8, len(rec.out) - k, lag + 8):
                d.window = 0
                d.propose(ctx[:p + j - lag], 1)            # in sync up to `lag` ids before the point
                d.window = window
                chain = d.propose(ctx[:p + j], k).tokens     # the missed ids, through the window
                hit = 0
                while hit < len(chain) and chain[hit] == rec.out[j + hit]:
                    hit += 1
                total, first, n = total + hit, first + (hit > 0), n + 1
    if n == 0:
        raise ValueError(f"no recording is long enough for a lag of {lag} ids and {k} tokens")
    return HoleQuality(lag, window, total / n, first / n, n)


def sweep(drafter_for: Callable[[Recording], DraftModelDrafter], recs: Mapping[str, Recording], lags: Sequence[int],
          windows: Sequence[int], k: int = 5) -> list[HoleQuality]:
    return [measure(drafter_for, recs, lag, w, k) for lag in lags for w in windows]


def report(rows: Sequence[HoleQuality], k: int) -> str:
    ref = {r.lag: r for r in rows if r.window == 0}
    lines = [f"{'lag':>4} {'window':>6} {'accepted of ' + str(k):>14} {'vs all fed':>10} {'first token':>11} samples"]
    for r in rows:
        base = ref.get(r.lag)
        rel = f"{(r.accepted / base.accepted - 1) * 100:+.1f}%" if base and base.accepted else "-"
        lines.append(f"{r.lag:>4} {r.window or 'all':>6} {r.accepted:>14.3f} {rel:>10} {r.first:>11.3f} {r.samples}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replay", required=True, type=Path, help="recordings saved by `auto_replay --record F`")
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b")
    p.add_argument("--lags", default="24,64", help="ids missed before each point (comma-separated)")
    p.add_argument("--windows", default="0,8,16,32", help="catch-up windows to compare (0: every id fed)")
    p.add_argument("--k", type=int, default=5, help="draft tokens asked for at each point")
    args = p.parse_args(argv)
    from speczoo.decoding.drafters.draft_model import make_draft_drafter
    from speczoo.request import GenerationRequest
    from speczoo.runtime import load

    recs = load_recordings(args.replay)
    target, draft = load(args.target), load(args.draft)
    make = make_draft_drafter(draft, target, max(len(r.prompt) + len(r.out) for r in recs.values()) + 64)
    rows = sweep(lambda rec: make(GenerationRequest(prompt_ids=rec.prompt)), recs,
                 [int(x) for x in args.lags.split(",")], [int(x) for x in args.windows.split(",")], args.k)
    print(f"{args.draft} drafting for {args.target}, {len(recs)} recordings, chains of {args.k}")
    print(report(rows, args.k))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
