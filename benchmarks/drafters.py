"""Drafters side by side: every built-in prompt × every speculative mode against greedy, interleaved.

    python -m benchmarks.drafters [TARGET] [--prompts verbatim,code_edit,extractive_qa,free_form]
                                  [--modes ngram,draft,auto] [--gen 128] [--runs 3] [--head NAME]

The mode `draft-noguess` is the draft model without its prompt-lookup guesses (decoding/drafters/guess.py):
beside `draft` it measures what the guesses save. The mode `auto-noeagle` is `auto` without the EAGLE
head: beside `auto` it measures what an installed head adds to the controller's choice (or costs it).

This machine's speed drifts by a third within minutes (docs/results.md), so separate A/B runs per mode
would compare modes measured in different states. Here each of --runs rounds runs greedy and every mode
once, back to back, in a rotating order; a mode's speedup is the median over rounds of its tok/s over
greedy's in the same round, and `auto` is compared with the best single mode the same way. Every run
drafts from a suffix memory of its own (a tenant no other run reads), so `auto` never copies an earlier
round's answer to the same prompt: a user asks a question once. Lossless:
every run of every mode gives the greedy ids of the first round. One process, one load, costs
re-measured at load (as `speczoo bench` does); the draft model is the zoo's default draft of the target.
A measurement script, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from dataclasses import dataclass, field

from speczoo.bench.ab import run_request
from speczoo.decoding.drafters.registry import EAGLE_HEAD
from speczoo.request import GenerationRequest

OFF = "off"
NOGUESS = "draft-noguess"
NOEAGLE = "auto-noeagle"
VARIANTS = (NOGUESS, NOEAGLE)       # modes that are not single drafters of their own


@dataclass
class ModeRuns:
    """One mode's runs on one prompt, round by round."""
    tok_s: list[float] = field(default_factory=list)
    accepted_per_round: list[float] = field(default_factory=list)
    lossless: bool = True
    ids: list[int] = field(default_factory=list)     # the output of its first run


def interleaved(runtime, prompt_ids: list[int], modes: list[str], k: int, gen: int, runs: int
                ) -> dict[str, ModeRuns]:
    """`runs` rounds of greedy plus every mode, once each per round in a rotating order (after one short
    warm-up of each). Returns per mode (greedy under "off") its runs; ids are checked against greedy's."""
    if runs < 1:
        raise ValueError(f"--runs must be >= 1, got {runs}")
    order = [OFF, *modes]
    base = GenerationRequest(prompt_ids=prompt_ids, max_new_tokens=gen, k=k)
    for mode in order:
        run_mode(runtime, GenerationRequest(**{**base.__dict__, "spec": mode, "max_new_tokens": min(8, gen),
                                               "tenant": f"drafters:warm-up:{mode}"}))
    out = {mode: ModeRuns() for mode in order}
    reference: list[int] = []
    for r in range(runs):
        for mode in order[r % len(order):] + order[:r % len(order)]:   # round 0 starts with greedy
            done = run_mode(runtime, GenerationRequest(**{**base.__dict__, "spec": mode,
                                                          "tenant": f"drafters:{mode}:{r}"}))
            if r == 0 and mode == OFF:
                reference = done.ids
            res = out[mode]
            res.tok_s.append(done.stats.tok_s)
            res.accepted_per_round.append(done.stats.accepted_per_round)
            res.lossless = res.lossless and done.ids == reference
            res.ids = res.ids or done.ids
    return out


_NOEAGLE: dict[int, tuple[object, object]] = {}    # id(engine) -> (engine, its variant for NOEAGLE), reused


def run_mode(runtime, req: GenerationRequest):
    """Run a request; the mode NOEAGLE runs as "auto" on a variant of the runtime's engine whose EAGLE
    drafters `auto` may not pick (one variant per engine, reused, so it calibrates across its runs)."""
    if req.spec != NOEAGLE:
        return run_request(runtime, req)
    eng = runtime.engine
    if id(eng) not in _NOEAGLE:
        specs = [dataclasses.replace(s, auto=False) if s.takes_name == EAGLE_HEAD else s for s in eng.drafters.values()]
        _NOEAGLE[id(eng)] = (eng, eng.offering(specs))
    runtime.engine = _NOEAGLE[id(eng)][1]
    try:
        return run_request(runtime, GenerationRequest(**{**req.__dict__, "spec": "auto"}))
    finally:
        runtime.engine = eng


def add_noguess(rt) -> None:
    """Offer the draft model without guesses as the mode NOGUESS, at the draft's price (not in auto)."""
    from speczoo.decoding.drafters.draft_model import make_draft_drafter

    if "draft" not in rt.engine.drafters:
        raise ValueError(f"{NOGUESS} needs a draft model")
    draft = rt.engine.drafters["draft"]
    rt.engine = rt.engine.offer(dataclasses.replace(draft, name=NOGUESS, auto=False, takes_name=None, names=(),
                                                    factory=make_draft_drafter(rt.draft, rt.target, rt.max_seq)))


def paired_ratio(a: ModeRuns, b: ModeRuns) -> float:
    """The median over rounds of a's tok/s over b's in the same round."""
    return statistics.median(x / y for x, y in zip(a.tok_s, b.tok_s))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", default="qwen2.5-coder-1.5b", help="zoo name of the target")
    ap.add_argument("--prompts", default="verbatim,code_edit,extractive_qa,free_form", help="built-in prompts")
    ap.add_argument("--modes", default="ngram,draft,auto", help="speculative modes, compared side by side")
    ap.add_argument("--gen", type=int, default=128, help="new tokens per run")
    ap.add_argument("--runs", type=int, default=3, help="rounds (greedy and every mode once each)")
    ap.add_argument("--k", type=int, default=8, help="max draft tokens per round")
    ap.add_argument("--head", default=None, help="EAGLE head (installed name or directory) for eagle, eagle-tree "
                                                 "and auto (default: the newest installed for the target)")
    args = ap.parse_args(argv)

    from speczoo.bench.prompts import builtin_prompt
    from speczoo.commands.suite import draft_to_load
    from speczoo.runtime import load_runtime

    prompts = args.prompts.split(",")
    for name in prompts:
        builtin_prompt(name)                                   # unknown names fail before any loading
    modes = args.modes.split(",")
    if OFF in modes:
        raise ValueError("greedy ('off') is the baseline every round already runs; leave it out of --modes")
    draft = draft_to_load(args.target, [{NOGUESS: "draft", NOEAGLE: "auto"}.get(m, m) for m in modes], None)
    rt = load_runtime(args.target, draft, remeasure_costs=True, eagle_head=args.head)   # today's costs
    if NOGUESS in modes:
        add_noguess(rt)
    print(f"target {args.target}, draft {draft}, {args.gen} tokens, K <= {args.k}, {args.runs} interleaved "
          f"round(s); speedup = median over rounds of tok/s over greedy's in the same round")
    for name in prompts:
        ids = rt.chat_ids([{"role": "user", "content": builtin_prompt(name).message}])
        res = interleaved(rt, ids, modes, args.k, args.gen, args.runs)
        greedy = res[OFF]
        print(f"{name:14s} greedy {statistics.median(greedy.tok_s):6.1f} tok/s "
              f"(runs {', '.join(f'{x:.1f}' for x in greedy.tok_s)})", flush=True)
        for mode in modes:
            r = res[mode]
            print(f"{name:14s} {mode:6s} {statistics.median(r.tok_s):6.1f} tok/s  speedup "
                  f"{paired_ratio(r, greedy):.2f}x  accepted/round {statistics.median(r.accepted_per_round):.2f}  "
                  f"lossless {'PASS' if r.lossless else 'FAIL'}", flush=True)
        singles = [m for m in modes if m not in ("auto", *VARIANTS)]
        if "auto" in modes and singles:
            best = max(singles, key=lambda m: paired_ratio(res[m], greedy))
            print(f"{name:14s} auto vs best single ({best}): {paired_ratio(res['auto'], res[best]) - 1:+.1%}",
                  flush=True)
        if "auto" in modes and NOEAGLE in modes:
            print(f"{name:14s} auto vs auto without the head: {paired_ratio(res['auto'], res[NOEAGLE]) - 1:+.1%}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
