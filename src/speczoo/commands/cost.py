"""`speczoo cost`: print what the cost model predicts (best K, tokens per round, speedup, break-even α).

Only parses arguments, calls speczoo.decoding.pricing.cost and prints tables; it never runs a model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from speczoo.decoding.pricing.cost import CvCurve, best_k, break_even_alpha, ceiling

DEFAULT_ALPHAS = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
DEFAULT_DRAFT_COSTS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
DRAFT_TABLE_ALPHAS = [0.6, 0.7, 0.8]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cost", help="cost-model tables: best K, tokens/round, speedup, break-even acceptance",
        description="Predict speculative-decoding speedups from the acceptance rate α, the verify cost "
                    "c_v (a target forward over S tokens relative to S=1) and the drafter's cost per "
                    "proposed token (relative to one target step).")
    cv = p.add_mutually_exclusive_group()
    cv.add_argument("--cv", default="1.0,1.3",
                    help="constant verify costs, comma separated (default: 1.0,1.3)")
    cv.add_argument("--cv-json", type=Path, metavar="FILE",
                    help="a measured c_v curve: the JSON printed by `speczoo cv MODEL --json` "
                         '({"cv": {"1": 1.0, "2": 1.05, ...}})')
    p.add_argument("--draft-cost", default=None, metavar="R[,R...]",
                   help="draft-model cost per proposed token in target steps, comma separated "
                        "(default: 0.1,...,0.7)")
    p.add_argument("--alphas", default=",".join(str(a) for a in DEFAULT_ALPHAS), metavar="A[,A...]",
                   help="acceptance rates for the n-gram table")
    p.add_argument("--kmax", type=int, default=8, help="largest K considered (default 8)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    curves = _curves(args)
    alphas = _floats(args.alphas, "--alphas")
    draft_costs = _floats(args.draft_cost, "--draft-cost") if args.draft_cost else DEFAULT_DRAFT_COSTS
    if args.kmax < 1:
        raise ValueError(f"--kmax must be >= 1, got {args.kmax}")
    console = Console()
    for curve in curves:
        console.print(ngram_table(curve, alphas, args.kmax))
    console.print(draft_table(curves, draft_costs, args.kmax))
    return 0


def ngram_table(curve: CvCurve, alphas: list[float], k_max: int) -> Table:
    t = Table(title=f"n-gram drafts (draft cost 0), {curve.source}, K ≤ {k_max}")
    for col in ("α", "best K", "E tokens/round", "speedup"):
        t.add_column(col, justify="right")
    for a in alphas:
        b = best_k(a, curve, 0.0, k_max)
        t.add_row(f"{a:.2f}", str(b.k), f"{b.expected:.2f}", f"{b.speedup:.2f}×")
    b = ceiling(dict(curve.points)) if curve.points else best_k(1.0, curve, 0.0, k_max)
    t.add_row("1.00 (ceiling)", str(b.k), f"{b.expected:.2f}", f"{b.speedup:.2f}×")
    return t


def draft_table(curves: list[CvCurve], draft_costs: list[float], k_max: int) -> Table:
    t = Table(title=f"draft model: break-even α and speedup at the best K ≤ {k_max}")
    t.add_column("c_v", justify="left")
    t.add_column("draft cost", justify="right")
    t.add_column("break-even α", justify="right")
    for a in DRAFT_TABLE_ALPHAS:
        t.add_column(f"α={a:.1f} (K)", justify="right")
    for curve in curves:
        for r in draft_costs:
            be = break_even_alpha(curve, r, k_max)
            cells = [curve.source, f"{r:.2f}", "never" if be is None else f"{be:.3f}"]
            for a in DRAFT_TABLE_ALPHAS:
                b = best_k(a, curve, r, k_max)
                cells.append(f"{b.speedup:.2f}× ({b.k})")
            t.add_row(*cells)
    return t


def _curves(args: argparse.Namespace) -> list[CvCurve]:
    if args.cv_json is not None:
        try:
            data = json.loads(args.cv_json.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{args.cv_json} is not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or not isinstance(data.get("cv"), dict):
            raise ValueError(f'{args.cv_json} has no "cv" object; expected the output of '
                             f"`speczoo cv MODEL --json`")
        return [CvCurve.measured(data["cv"], source=f"c_v from {args.cv_json.name}")]
    return [CvCurve.constant(c) for c in _floats(args.cv, "--cv")]


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"{flag} takes comma-separated numbers, got {text!r}") from exc
    if not values:
        raise ValueError(f"{flag} is empty")
    return values
