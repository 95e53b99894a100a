"""`speczoo serve-soak [MODEL]`: the server under minutes of mixed traffic (valid streams and answers,
clients that leave, bad requests); no 5xx, no slot leaked, resident memory flat. The soak lives in
`speczoo.bench.soak`."""

from __future__ import annotations

import argparse

from speczoo.commands._model_args import add_model_args, draft_for

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-soak", help="mixed traffic on the server for a while: no 5xx, no slot "
                       "leaked, memory flat",
                       description="Serve MODEL on a loopback port (spec auto, as `speczoo serve`) and run "
                       "CLIENTS threads of mixed requests for SECONDS; exit 1 when a 5xx came back, a slot "
                       "stayed held or resident memory moved more than 5%% after the warm-up.")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"zoo name (default {DEFAULT_MODEL})")
    p.add_argument("--seconds", type=float, default=600, help="how long the clients send (default 600)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--parallel", type=int, default=8, help="generations the server batches at once "
                   "(speczoo serve --parallel; default 8)")
    p.add_argument("--max-queue", type=int, default=64, help="requests allowed to wait, then 503 "
                   "(speczoo serve --max-queue; default 64)")
    p.add_argument("--max-tokens", type=int, default=128, help="the most tokens a valid request asks "
                   "for; each asks for a random number up to it (default 128)")
    p.add_argument("--seed", type=int, default=0, help="seed of the clients' choices (default 0)")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between memory and /metrics "
                   "samples (default 5)")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speczoo.bench.soak import run_soak
    from speczoo.runtime import load_runtime

    runtime = load_runtime(args.model, draft=draft_for(args.model, "auto", args.draft),
                           backend=args.backend, max_seq=args.max_seq, kv_type=args.kv_type,
                           draft_vocab=args.draft_vocab)
    res = run_soak(runtime, args.seconds, clients=args.clients, parallel=args.parallel,
                   max_queue=args.max_queue, max_tokens=args.max_tokens, seed=args.seed,
                   sample_every=args.sample_every)
    for line in res.lines():
        print(line)
    return 0 if res.ok else 1
