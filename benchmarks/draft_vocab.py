"""The draft model's reduced vocabulary (`--draft-vocab N`): its step cost r and the speedup, per N.

    python -m benchmarks.draft_vocab [TARGET] [--vocab 0,16384,32768] [--prompts free_form]
                                     [--gen 128] [--runs 3] [--rounds 3]

For each N of --vocab (0: the draft's full LM head) it prints:
  * r = draft step / target step, timed: one-row forwards after a 64-token context (pricing/profile.py's
    timing), the draft's heads interleaved in one loop and the target timed between them, --rounds
    times; r is the median over rounds of the draft's step over the target's in the same round;
  * r by weight bytes: what a draft step reads over what a target step reads (a decode step is bound by
    its weight reads; unlike a timing, this does not move with the machine's load);
  * the share of the target's greedy output ids (per prompt) below N: what the reduced head can propose
    besides the prompt's own ids, the ceiling on its acceptance;
  * per prompt, the draft model drafting from that head as its own mode, priced at that r, run
    interleaved with greedy round by round
    (benchmarks/drafters.py `interleaved`): speedup = median over rounds of tok/s over greedy's in the same
    round, accepted per round, and lossless (every run's ids equal greedy's).
One process, one load of each model. A measurement script, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch


def mode_name(n: int) -> str:
    return f"draft-v{n}" if n else "draft-full"


def parse_vocab(text: str) -> list[int]:
    sizes = [int(x) for x in text.split(",") if x.strip()]
    if not sizes or any(n < 0 for n in sizes):
        raise ValueError(f"--vocab must list sizes >= 0 (0: the full head), got {text!r}")
    return sizes


def weight_bytes(module, skip: tuple = ()) -> int:
    """The bytes of every tensor `module` and its submodules hold (each storage once), `skip` left out."""
    seen: dict[tuple[int, int], int] = {}
    for m in module.modules():
        for t in [*vars(m).values(), *m._parameters.values(), *m._buffers.values()]:
            if isinstance(t, torch.Tensor) and not any(t is x for x in skip):
                seen[(t.data_ptr(), t.nbytes)] = t.nbytes
    return sum(seen.values())


def byte_ratios(rt, sizes: list[int]) -> dict[int, float]:
    """r by weight bytes per N: what a one-row draft step reads through N's head (its blocks' weights and
    norms, the head's kept rows; one embedding row, left out) over what a target step reads. A step of
    these models is bound by its weight reads, so this is r on a machine whose memory bandwidth is the
    limit, whatever the load now."""
    from speczoo.decoding.drafters.draft_model import reduced_head

    def body(model) -> int:
        return weight_bytes(model, skip=(model.embed,)) - weight_bytes(model.lm_head)

    target = body(rt.target.model) + weight_bytes(rt.target.model.lm_head)
    out = {}
    for n in sizes:
        head = reduced_head(rt.draft.model, n or None)
        out[n] = (body(rt.draft.model) + weight_bytes(head.common if head else rt.draft.model.lm_head)) / target
    return out


def step_ratios(rt, sizes: list[int], rounds: int, repeats: int = 3) -> dict[int, float]:
    """r per N: the median over `rounds` of (draft step through N's head) / (target step), each a
    median of `repeats` one-row forwards; the draft's heads are timed interleaved in one loop."""
    from speczoo.decoding.drafters.draft_model import reduced_head
    from speczoo.decoding.pricing.profile import PROFILE_CONTEXT, Series, measure_cv, measure_series

    series = {n: Series((1,), reduced_head(rt.draft.model, n or None)) for n in sizes}
    ratios: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):
        target = measure_cv(rt.target.model, rt.target.args, [1], context=PROFILE_CONTEXT, repeats=repeats,
                            warmup=1).ms[1]
        draft = measure_series(rt.draft.model, rt.draft.args, series, PROFILE_CONTEXT, repeats, warmup=1)
        for n in sizes:
            ratios[n].append(draft[n].ms[1] / target)
    return {n: statistics.median(r) for n, r in ratios.items()}


def offer_sizes(rt, r: dict[int, float]) -> None:
    """Offer the draft model at each N of `r` as the mode mode_name(N) (not in auto), built as a Runtime
    with draft_vocab=N builds it and priced at r[N], its step measured here (a runtime's own profile, timed
    within a budget at load, may leave the reduced head's step out on a busy machine)."""
    from speczoo.runtime import Runtime

    for n, cost in r.items():
        other = Runtime(rt.target, rt.draft, max_seq=rt.max_seq, draft_vocab=n or None)
        spec = other.engine.drafters["draft"]
        rt.engine = rt.engine.offer(dataclasses.replace(spec, name=mode_name(n), cost=cost, auto=False,
                                                        takes_name=None, names=()))


def coverage(ids: list[int], n: int) -> float:
    """The share of `ids` below n (n = 0: all of them, the full head)."""
    return sum(i < n for i in ids) / len(ids) if n and ids else 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", default="qwen2.5-coder-1.5b", help="zoo name of the target")
    ap.add_argument("--vocab", default="0,16384,32768", help="draft head sizes to compare (0: the full head)")
    ap.add_argument("--prompts", default="free_form", help="built-in prompts")
    ap.add_argument("--gen", type=int, default=128, help="new tokens per run")
    ap.add_argument("--runs", type=int, default=3, help="rounds of greedy and every size once each")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of step timings for r")
    ap.add_argument("--k", type=int, default=8, help="max draft tokens per round")
    args = ap.parse_args(argv)
    sizes = parse_vocab(args.vocab)

    from benchmarks.drafters import OFF, interleaved, paired_ratio
    from speczoo.bench.prompts import builtin_prompt
    from speczoo.commands.suite import draft_to_load
    from speczoo.runtime import load_runtime

    prompts = args.prompts.split(",")
    for name in prompts:
        builtin_prompt(name)                                   # unknown names fail before any loading
    draft = draft_to_load(args.target, ["draft"], None)
    if draft is None:
        raise ValueError(f"{args.target} has no draft model in the zoo")
    rt = load_runtime(args.target, draft, remeasure_costs=True)
    vocab = rt.draft.args.vocab_size
    print(f"target {args.target}, draft {draft} ({vocab} ids), {args.gen} tokens, K <= {args.k}, {args.runs} "
          f"interleaved round(s)")
    rb = byte_ratios(rt, sizes)
    r = step_ratios(rt, sizes, args.rounds)
    for n in sizes:
        print(f"{mode_name(n):12s} head rows {n or vocab:6d} ({(n or vocab) / vocab:5.1%})  r = draft step / "
              f"target step: timed {r[n]:.3f}, by weight bytes {rb[n]:.3f}", flush=True)
    offer_sizes(rt, r)
    modes = [mode_name(n) for n in sizes]
    for name in prompts:
        ids = rt.chat_ids([{"role": "user", "content": builtin_prompt(name).message}])
        res = interleaved(rt, ids, modes, args.k, args.gen, args.runs)
        greedy = res[OFF]
        print(f"{name:14s} greedy {statistics.median(greedy.tok_s):6.1f} tok/s", flush=True)
        for n, mode in zip(sizes, modes):
            m = res[mode]
            print(f"{name:14s} {mode:11s} output ids below N {coverage(greedy.ids, n):6.1%}  "
                  f"{statistics.median(m.tok_s):6.1f} tok/s  speedup "
                  f"{paired_ratio(m, greedy):.2f}x  accepted/round {statistics.median(m.accepted_per_round):.2f}  "
                  f"lossless {'PASS' if m.lossless else 'FAIL'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
