"""`speczoo generate MODEL --prompt TEXT`: stream a completion to stdout, stats to stderr."""

from __future__ import annotations

import sys

from speczoo.commands._model_args import add_model_args, draft_for, eagle_for


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt (streaming)")
    p.add_argument("model", help="zoo name or path")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as one user message in the chat template")
    p.add_argument("-n", "--max-tokens", type=int, default=128, help="max new tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--spec", default="off", help="off | ngram | ngram-tree | draft | eagle[:NAME] | "
                   "eagle-tree[:NAME] | auto (default off); the tree modes draft a token tree of up to --k nodes")
    p.add_argument("--k", type=int, default=8, help="max draft tokens per round")
    p.add_argument("--ngram", type=int, default=3, help="max n-gram order of prompt lookup")
    p.add_argument("--stats", action="store_true", help="print tok/s and acceptance to stderr")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from speczoo.events import DoneEvent
    from speczoo.request import GenerationRequest, SamplingParams
    from speczoo.runtime import load_runtime

    rt = load_runtime(args.model, draft=draft_for(args.model, args.spec, args.draft),
                      backend=args.backend, max_seq=args.max_seq, kv_type=args.kv_type,
                      eagle_head=eagle_for(args.spec), draft_vocab=args.draft_vocab)
    if args.chat:
        ids = rt.chat_ids([{"role": "user", "content": args.prompt}])
    else:
        ids = rt.tokenizer.encode(args.prompt, add_special=True)
    req = GenerationRequest(prompt_ids=ids, max_new_tokens=args.max_tokens, spec=args.spec, k=args.k,
                            ngram=args.ngram, stop=args.stop,
                            sampling=SamplingParams(temperature=args.temperature, top_k=args.top_k,
                                                    top_p=args.top_p, seed=args.seed))
    for ev in rt.generate(req):
        if isinstance(ev, DoneEvent):
            sys.stdout.write("\n")
            if args.stats:
                s = ev.stats
                print(f"[{s.new_tokens} tokens, {s.tok_s:.2f} tok/s, prefill {s.prefill_seconds:.2f}s, "
                      f"{s.rounds} rounds, {s.accepted_per_round:.2f} accepted/round, finish {ev.finish_reason}]",
                      file=sys.stderr)
        else:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
    return 0
