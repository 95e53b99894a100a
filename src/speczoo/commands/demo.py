"""`speczoo demo`: the main job — the A/B bench on the default target over the built-in prompts.

Each prompt's result is printed (and flushed) the moment it is known, then the summary table; the demo
must never sit silent until the end. It prints how long the user waited for the first result and for the
whole (the load, with a first run's cost profile, apart).

What it spends its time on is what it shows: one short warm-up (WARMUP_PROMPT ids of the first prompt,
WARMUP_TOKENS speculative) takes the cold start (the first touch of the weights) off the first timed run,
instead of a warm-up over each whole prompt: tok/s counts decode time only, so a prompt's prefill is not
what a warm-up is for, and on a slow CPU those prefills cost about as much as a greedy run. It reads the
target's stored cost profile, as every runtime does (timed once, on the first run:
decoding/pricing/profile.py); --remeasure-costs times it afresh for this run. It only parses, calls the
bench and prints.
"""

from __future__ import annotations

import statistics
import sys
import time

from speczoo.commands._model_args import add_model_args, draft_for

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
WARMUP_PROMPT = 32      # ids of the first prompt the warm-up runs on
WARMUP_TOKENS = 8       # tokens it generates, speculative


def register(sub) -> None:
    p = sub.add_parser("demo", help="speculative vs plain greedy on built-in prompts, as a table")
    p.add_argument("target", nargs="?", default=DEFAULT_TARGET, help=f"target model (default {DEFAULT_TARGET})")
    p.add_argument("--spec", default="ngram", help="speculative mode (default ngram)")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--gen", type=int, default=128, help="new tokens per run")
    p.add_argument("--runs", type=int, default=1, help="runs of each side per prompt (medians)")
    p.add_argument("--only", nargs="*", help="names of built-in prompts to run (default: all)")
    p.add_argument("--remeasure-costs", action="store_true",
                   help="time the cost profile afresh for this run (the machine's present speed) instead of "
                        "reading the one stored at the first run; it is not stored")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    began = time.perf_counter()
    from rich.console import Console
    from rich.table import Table

    from speczoo.bench.ab import run_ab, run_request
    from speczoo.bench.prompts import BUILTIN_PROMPTS
    from speczoo.request import GenerationRequest
    from speczoo.runtime import load_runtime

    unknown = sorted(set(args.only or ()) - {p.name for p in BUILTIN_PROMPTS})
    if unknown:
        raise ValueError(f"--only {' '.join(unknown)}: no such built-in prompt; "
                         f"they are: {', '.join(p.name for p in BUILTIN_PROMPTS)}")
    prompts = [p for p in BUILTIN_PROMPTS if not args.only or p.name in args.only]
    say(f"speczoo demo: loading {args.target}, then {len(prompts)} prompt(s), each run plain greedy and "
        f"--spec {args.spec} ({args.gen} new tokens, {args.runs} run(s) of each side)")
    rt = load_runtime(args.target, draft=draft_for(args.target, args.spec, args.draft),
                      backend=args.backend, max_seq=args.max_seq, kv_type=args.kv_type,
                      remeasure_costs=args.remeasure_costs, draft_vocab=args.draft_vocab)
    loaded = time.perf_counter() - began
    table = Table(title=f"{args.target}: --spec {args.spec} vs plain greedy "
                        f"({args.gen} new tokens, backend {rt.target.backend}, median of {args.runs})")
    for col in ("prompt", "greedy tok/s", "spec tok/s", "speedup", "accepted/round", "lossless"):
        table.add_column(col, justify="left" if col == "prompt" else "right")
    failed = False
    for i, p in enumerate(prompts, 1):
        ids = rt.chat_ids([{"role": "user", "content": p.message}])
        say(f"[{i}/{len(prompts)}] {p.kind} ({len(ids)} prompt tokens) ...")
        if i == 1:
            run_request(rt, GenerationRequest(prompt_ids=ids[:WARMUP_PROMPT], max_new_tokens=WARMUP_TOKENS,
                                              spec=args.spec, k=args.k, ngram=args.ngram))
        res = run_ab(rt, ids, args.spec, k=args.k, ngram=args.ngram, gen=args.gen, runs=args.runs, warmup=False)
        for line in res.lines():        # SPEC LOSSLESS ... PASS|FAIL, SPEC STATS (speeds, speedup, accepted)
            say("  " + line)
        if i == 1:
            say(f"speczoo demo: first result after {time.perf_counter() - began:.1f} s (loading {loaded:.1f} s)")
        failed |= not res.lossless
        table.add_row(*_row(p.kind, res))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    total = time.perf_counter() - began
    say(f"speczoo demo: done in {total:.1f} s (loading {loaded:.1f} s, {len(prompts)} prompt(s) {total - loaded:.1f} s)")
    return 1 if failed else 0


def say(line: str) -> None:
    """One line to stdout, now: a piped stdout is block-buffered and would hold it back to the end."""
    print(line, flush=True)


def _row(kind: str, res) -> tuple[str, ...]:
    """The table's row for one prompt's A/B result."""
    g = statistics.median(res.greedy_tok_s)
    s = statistics.median(res.spec_tok_s)
    return (kind, f"{g:.1f}", f"{s:.1f}", f"{res.speedup:.2f}x", f"{res.accepted_per_round:.2f}",
            f"{res.matching}/{len(res.greedy_ids)} {'PASS' if res.lossless else 'FAIL'}")
