"""`speczoo suite TARGET`: every question × every method on one runtime → results, summary, plot."""

from __future__ import annotations

import argparse
from pathlib import Path

from speczoo.commands._model_args import draft_for, eagle_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "suite", help="benchmark decoding methods over a Spec-Bench question set (resumable)",
        description="Generate every question with every method on the same runtime; write "
                    "OUT/results.jsonl (one row per question and method, appended as it goes: rerun "
                    "the same command to resume), OUT/summary.md and OUT/speedup.png.")
    p.add_argument("target", help="zoo name of the target model")
    p.add_argument("--questions", default="builtin",
                   help="Spec-Bench JSON-lines file, or 'builtin' for the built-in set (default)")
    p.add_argument("--methods", default="off,ngram,auto",
                   help="comma-separated: off, ngram, draft, draft:NAME, auto, eagle:NAME "
                        "(off is required and runs first; default off,ngram,auto)")
    p.add_argument("--gen", type=int, default=256, help="max new tokens per turn (default 256)")
    p.add_argument("--limit", type=int, help="only the first N questions of each category")
    p.add_argument("--categories", help="comma-separated categories to run (default: all)")
    p.add_argument("--k", type=int, default=8, help="max draft tokens per round (default 8)")
    p.add_argument("--ngram", type=int, default=3, help="max n-gram order for prompt lookup (default 3)")
    p.add_argument("--draft", help="draft model to load (default: the NAME of a draft:NAME method, else the zoo's draft "
                   "of the target for the draft and auto methods)")
    p.add_argument("--backend", help="linear backend of the runtime (default: the runtime's choice)")
    p.add_argument("--max-seq", type=int, default=4096, help="KV cache length (default 4096)")
    p.add_argument("--out", type=Path, required=True, help="output directory (resumed if it has rows)")
    p.add_argument("--no-plot", action="store_true", help="skip speedup.png (no matplotlib needed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def draft_to_load(target: str, methods: list[str], explicit: str | None) -> str | None:
    """The one draft model the runtime must load: --draft, the NAME of draft:NAME methods, or, for the
    draft and auto methods, the zoo's default draft of the target (as bench, generate, chat and serve)."""
    names = {n for m in methods for n in [draft_for(target, m, explicit)] if n is not None}
    if len(names) > 1:
        raise ValueError(f"one runtime loads one draft model; got {', '.join(sorted(names))}: run the suite once "
                         "per draft model into the same --out (rows are kept) instead")
    return names.pop() if names else None


def head_to_load(methods: list[str]) -> str | None:
    """The one EAGLE head the runtime must load: the NAME of eagle:NAME / eagle-tree:NAME methods (None:
    the newest installed for the target, if any). A runtime resolves its head once, at load."""
    names = {n for m in methods for n in [eagle_for(m)] if n is not None}
    if len(names) > 1:
        raise ValueError(f"one runtime loads one EAGLE head; got {', '.join(sorted(names))}: run the suite once "
                         "per head into the same --out (rows are kept) instead")
    return names.pop() if names else None


def run(args: argparse.Namespace) -> int:
    from speczoo.bench.questions import load_questions, select
    from speczoo.bench.suite import SUMMARY, SuiteSettings, parse_methods, run_suite

    if args.gen < 1 or args.k < 1 or args.ngram < 1:
        raise ValueError("--gen, --k and --ngram must be >= 1")
    methods = parse_methods(args.methods)
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    questions = select(load_questions(args.questions), categories, args.limit)
    draft = draft_to_load(args.target, methods, args.draft)
    head = head_to_load(methods)

    from speczoo.runtime import load_runtime

    runtime = load_runtime(args.target, draft=draft, backend=args.backend, max_seq=args.max_seq, eagle_head=head)
    settings = SuiteSettings(methods=methods, max_new_tokens=args.gen, k=args.k, ngram=args.ngram,
                             backend=runtime.target.backend)
    outcome = run_suite(runtime, questions, settings, args.out, progress=not args.no_progress,
                        plot=not args.no_plot)
    print((outcome.out_dir / SUMMARY).read_text(encoding="utf-8"))
    print(f"{outcome.ran} rows generated, {outcome.skipped} resumed; results in {outcome.out_dir}")
    return 0
