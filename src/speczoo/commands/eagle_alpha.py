"""`speczoo eagle-alpha TARGET --head NAME --prompt TEXT|--builtin NAME`: how many tokens an EAGLE head's
drafts would get accepted per round on the target's own greedy continuation (replayed, every round
drafting)."""

from __future__ import annotations

import time

from speczoo.bench.prompts import BUILTIN_PROMPTS, builtin_prompt


def register(sub) -> None:
    p = sub.add_parser("eagle-alpha", help="acceptance of an EAGLE head, replayed on the target's greedy output",
                       description="Generate the target's greedy continuation of a prompt once, then replay the "
                                   "head's drafts against it: every round drafts K tokens (a chain, or a tree "
                                   "with --tree) and accepts what greedy verification would. No controller, no "
                                   "verify forwards: the head's acceptance alone.")
    p.add_argument("target", help="target model: zoo name or path")
    p.add_argument("--head", required=True, help="installed EAGLE head name, or a head directory")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (one user message through the chat template)")
    src.add_argument("--builtin", choices=[b.name for b in BUILTIN_PROMPTS], help="a built-in prompt")
    p.add_argument("--raw", action="store_true", help="do not wrap the prompt in the chat template")
    p.add_argument("-n", "--max-tokens", type=int, default=64, help="greedy tokens to replay on (default 64)")
    p.add_argument("--k", type=int, default=6, help="draft tokens per round (tree: node budget) (default 6)")
    p.add_argument("--tree", default=None, metavar="DEPTH,BRANCH",
                   help="draft EAGLE-2 trees of this depth and branching (e.g. 6,4) instead of chains")
    p.add_argument("--backend", default=None, help="the target's linear backend (the head uses the same)")
    p.set_defaults(func=run)


def run(args) -> int:
    from speczoo.runtime import load
    from speczoo.decoding.drafters.eagle import TreeShape
    from speczoo.eagle_drafters import load_for
    from speczoo.decoding.eagle_replay import greedy_with_features, replay
    from speczoo.zoo.heads import find_head

    tree = None
    if args.tree:
        try:
            depth, branch = (int(x) for x in args.tree.split(","))
        except ValueError:
            raise ValueError(f"--tree takes DEPTH,BRANCH (e.g. 6,4), got {args.tree!r}") from None
        tree = TreeShape(depth=depth, branch=branch)
    text = builtin_prompt(args.builtin).message if args.builtin else args.prompt
    t = load(args.target, args.backend)
    head = load_for(find_head(args.head), t.model, args.target, t.backend)
    if args.raw:
        prompt = t.tokenizer.encode(text, add_special=True)
    else:
        prompt = t.tokenizer.chat_ids([{"role": "user", "content": text}])
    t0 = time.perf_counter()
    ids, hidden = greedy_with_features(t.model, prompt, args.max_tokens, head.cfg.target_layers)
    t1 = time.perf_counter()
    res = replay(head, ids, hidden, len(prompt), args.k, tree)
    t2 = time.perf_counter()
    mode = f"tree {tree.depth}x{tree.branch}, {args.k} nodes" if tree else f"chain K={args.k}"
    print(f"{args.head} on {args.target} ({mode}, {len(ids) - len(prompt)} greedy tokens): "
          f"{res.accepted_per_round:.2f} accepted/round, {res.tokens_per_round:.2f} tokens/round over "
          f"{res.rounds} rounds (target greedy {t1 - t0:.1f}s, head replay {t2 - t1:.1f}s)")
    return 0
