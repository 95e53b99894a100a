"""Drafters side by side: every built-in prompt × every speculative mode, A/B against greedy, one process.

    python -m speczoo.bench.drafters [TARGET] [--prompts verbatim,code_edit,extractive_qa,free_form]
                                     [--modes ngram,draft,auto] [--gen 128] [--runs 1]

Each (prompt, mode) pair is the A/B of `speczoo bench TARGET --spec MODE --builtin PROMPT` (plain greedy and
speculative runs alternated on the same runtime; medians of --runs each; costs re-measured at load, as the
bench does), all in one process so that the modes share one load and one stretch of machine time. The draft model is the zoo's default draft of the
target. Prints one line per pair and, per prompt, how far `auto` is from the best single mode. A
measurement script, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import statistics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", default="qwen2.5-coder-1.5b", help="zoo name of the target")
    ap.add_argument("--prompts", default="verbatim,code_edit,extractive_qa,free_form", help="built-in prompts")
    ap.add_argument("--modes", default="ngram,draft,auto", help="speculative modes, compared side by side")
    ap.add_argument("--gen", type=int, default=128, help="new tokens per run")
    ap.add_argument("--runs", type=int, default=1, help="runs of each side per pair; medians are reported")
    ap.add_argument("--k", type=int, default=8, help="max draft tokens per round")
    args = ap.parse_args(argv)

    from speczoo.bench.ab import run_ab
    from speczoo.bench.prompts import builtin_prompt
    from speczoo.commands.suite import draft_to_load
    from speczoo.runtime import load_runtime

    prompts = args.prompts.split(",")
    for name in prompts:
        builtin_prompt(name)                                   # unknown names fail before any loading
    modes = args.modes.split(",")
    draft = draft_to_load(args.target, modes, None)
    rt = load_runtime(args.target, draft, remeasure_costs=True)   # as `speczoo bench`: today's costs
    print(f"target {args.target}, draft {draft}, {args.gen} tokens, K <= {args.k}, {args.runs} run(s) per side")
    for name in prompts:
        ids = rt.chat_ids([{"role": "user", "content": builtin_prompt(name).message}])
        spec = {}
        for mode in modes:
            r = run_ab(rt, ids, mode, k=args.k, gen=args.gen, runs=args.runs)
            spec[mode] = statistics.median(r.spec_tok_s)
            print(f"{name:14s} {mode:6s} greedy {statistics.median(r.greedy_tok_s):6.1f} tok/s  spec "
                  f"{spec[mode]:6.1f} tok/s  speedup {r.speedup:.2f}x  accepted/round "
                  f"{r.accepted_per_round:.2f}  lossless {'PASS' if r.lossless else 'FAIL'}", flush=True)
        singles = {m: v for m, v in spec.items() if m != "auto"}
        if "auto" in spec and singles:
            best = max(singles, key=singles.get)
            print(f"{name:14s} auto vs best single ({best}): {spec['auto'] / singles[best] - 1:+.1%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
