"""`speczoo demo`: the main job — the A/B bench on the default target over the built-in prompts."""

from __future__ import annotations

from speczoo.commands._model_args import add_model_args, draft_for

DEFAULT_TARGET = "qwen2.5-coder-1.5b"


def register(sub) -> None:
    p = sub.add_parser("demo", help="speculative vs plain greedy on built-in prompts, as a table")
    p.add_argument("target", nargs="?", default=DEFAULT_TARGET, help=f"target model (default {DEFAULT_TARGET})")
    p.add_argument("--spec", default="ngram", help="speculative mode (default ngram)")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--gen", type=int, default=128, help="new tokens per run")
    p.add_argument("--runs", type=int, default=1, help="runs of each side per prompt (medians)")
    p.add_argument("--only", nargs="*", help="names of built-in prompts to run (default: all)")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from speczoo.bench.ab import run_ab
    from speczoo.bench.prompts import BUILTIN_PROMPTS
    from speczoo.runtime import load_runtime

    console = Console()
    rt = load_runtime(args.target, draft=draft_for(args.target, args.spec, args.draft),
                      backend=args.backend, max_seq=args.max_seq, remeasure_costs=True)
    table = Table(title=f"{args.target}: --spec {args.spec} vs plain greedy "
                        f"({args.gen} new tokens, backend {rt.target.backend}, median of {args.runs})")
    for col in ("prompt", "greedy tok/s", "spec tok/s", "speedup", "accepted/round", "lossless"):
        table.add_column(col, justify="left" if col == "prompt" else "right")
    failed = False
    for p in BUILTIN_PROMPTS:
        if args.only and p.name not in args.only:
            continue
        ids = rt.chat_ids([{"role": "user", "content": p.message}])
        res = run_ab(rt, ids, args.spec, k=args.k, ngram=args.ngram, gen=args.gen, runs=args.runs)
        console.print(f"[bold]{p.kind}[/bold] ({len(ids)} prompt tokens)")
        for line in res.lines():
            console.print("  " + line, markup=False, highlight=False)
        failed |= not res.lossless
        g = sorted(res.greedy_tok_s)[len(res.greedy_tok_s) // 2]
        s = sorted(res.spec_tok_s)[len(res.spec_tok_s) // 2]
        table.add_row(p.kind, f"{g:.1f}", f"{s:.1f}", f"{res.speedup:.2f}x", f"{res.accepted_per_round:.2f}",
                      f"{res.matching}/{len(res.greedy_ids)} {'PASS' if res.lossless else 'FAIL'}")
    console.print(table)
    return 1 if failed else 0
