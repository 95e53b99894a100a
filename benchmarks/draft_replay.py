"""What the draft model would give under each drafting rule, replayed offline from one greedy run.

    python -m benchmarks.draft_replay [TARGET] [--prompts verbatim,code_edit,extractive_qa,free_form]
                                      [--gen 128] [--k 8] [--rates 1.0,1.5,2.0]

With greedy verification the whole speculative run is fixed by two things: the target's greedy output and
what the draft model predicts, with what confidence, after each prefix of it (inside an accepted chain
the draft sees exactly the committed text). So one target run and one teacher-forced forward of the
draft over prompt + output (through its reduced drafting head) let every rule be replayed in
milliseconds. The replay charges each rule the runtime's measured costs (a round of K drafted tokens =
K draft steps + c_v(K + 1) + the round overhead, in target steps) and reports the predicted speedup of:
  * fixed K = 1..k (the draft always proposes K tokens), and
  * confidence floors at each --rates value (Tuning.stop_rate, decoding/tuning.py): up to k tokens, stopping
    once the product of the draft's confidences is below the floor.
One approximation: after its first wrong token the draft's later confidences are not observable offline
(it would continue from its own token); the replay lets it stop there, which flatters the floors a
little. This is the replay that chose Tuning.stop_rate. A measurement script, never imported by the runtime.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from speczoo.decoding.pricing.cost import round_cost


@dataclass
class Teacher:
    """The draft's greedy prediction and its probability for each output position (teacher-forced)."""
    out: list[int]          # the target's greedy output
    guess: list[int]        # guess[j]: the draft's argmax for out[j] given prompt + out[:j]
    sure: list[float]       # its softmax probability


def replay(t: Teacher, costs, k: int, floors: tuple[float, ...] | None) -> float:
    """Predicted speedup over plain decoding of drafting K tokens per round (floors None) or up to K
    under `floors` (floors[i - 1]: the least product of the first i confidences to draft token i + 1)."""
    n, i, time = len(t.out), 0, 0.0
    while i < n:
        drafted, accepted, alive, product = 0, 0, True, 1.0
        while drafted < k and i + 1 + drafted < n:
            j = i + 1 + drafted
            drafted += 1
            product *= t.sure[j]
            if alive and t.guess[j] == t.out[j]:
                accepted += 1
            else:
                alive = False
                if floors is not None:
                    break                                   # see the module docstring
            if floors is not None and drafted - 1 < len(floors) and product < floors[drafted - 1]:
                break
        if drafted == 0:                                    # the last token: a plain step
            time, i = time + 1.0, i + 1
            continue
        time += round_cost(drafted, costs.cv, costs.draft_cost["draft"], costs.round_overhead)
        i += 1 + accepted
    return n / time


def teacher(rt, prompt_ids: list[int], gen: int) -> Teacher:
    """The target's greedy output (through prompt lookup: the same ids, faster) and the draft's
    teacher-forced predictions over it."""
    import torch

    from speczoo.bench.ab import run_request
    from speczoo.decoding.drafters.draft_model import reduced_head
    from speczoo.cache import KVCache
    from speczoo.request import GenerationRequest

    out = run_request(rt, GenerationRequest(prompt_ids=prompt_ids, max_new_tokens=gen, spec="ngram")).ids
    seq = prompt_ids + out
    head = reduced_head(rt.draft.model)
    if head is not None:
        head.keep(prompt_ids)
    cache = KVCache(rt.draft.args, len(seq) + 1)
    logits = rt.draft.model(torch.tensor(seq), torch.arange(len(seq)), cache,
                            logit_rows=slice(len(prompt_ids) - 1, len(seq) - 1), head=head).logits   # [n, V]
    top = logits.softmax(-1).max(-1)
    return Teacher(out=out, guess=top.indices.tolist(), sure=top.values.tolist())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", default="qwen2.5-coder-1.5b", help="zoo name of the target")
    ap.add_argument("--prompts", default="verbatim,code_edit,extractive_qa,free_form", help="built-in prompts")
    ap.add_argument("--gen", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--k", type=int, default=8, help="the most draft tokens per round")
    ap.add_argument("--rates", default="1.0,1.5,2.0", help="stop rates to price the floors at")
    args = ap.parse_args(argv)

    from speczoo.bench.prompts import builtin_prompt
    from speczoo.runtime import load_runtime
    from speczoo.decoding.controller import Controller
    from speczoo.decoding.tuning import Tuning
    from speczoo.commands.suite import draft_to_load

    prompts = args.prompts.split(",")
    for name in prompts:
        builtin_prompt(name)                                   # unknown names fail before any loading
    rates = [float(r) for r in args.rates.split(",")]
    draft = draft_to_load(args.target, ["draft"], None)
    if draft is None:
        raise ValueError(f"{args.target} has no draft model in the zoo to replay")
    rt = load_runtime(args.target, draft, remeasure_costs=True)
    costs = rt.engine.costs
    print(f"target {args.target}, draft {draft}, {args.gen} tokens, K <= {args.k}; costs measured now: "
          f"draft step {costs.draft_cost['draft']:.2f}, c_v(2) {costs.cv(2):.2f}, c_v(5) {costs.cv(5):.2f}")
    print(f"{'prompt':14s} agree " + " ".join(f"{'K=' + str(k):>6s}" for k in range(1, args.k + 1))
          + " " + " ".join(f"{'rate ' + str(r):>9s}" for r in rates))
    for name in prompts:
        ids = rt.chat_ids([{"role": "user", "content": builtin_prompt(name).message}])
        t = teacher(rt, ids, args.gen)
        agree = sum(g == o for g, o in zip(t.guess, t.out)) / len(t.out)
        fixed = [replay(t, costs, k, None) for k in range(1, args.k + 1)]
        floored = [replay(t, costs, args.k, Controller(costs, ["draft"], k_max=args.k, confident={"draft"},
                                                      tuning=Tuning(stop_rate=r)).floors("draft", args.k))
                   for r in rates]
        print(f"{name:14s} {agree:5.2f} " + " ".join(f"{x:5.2f}x" for x in fixed) + " "
              + " ".join(f"{x:8.2f}x" for x in floored), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
