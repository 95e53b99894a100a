"""`speczoo chat`: a streaming terminal chat with one model; the logic is in `speczoo.chat`.

Only parses arguments, loads the runtime and feeds terminal lines to a `ChatSession`. Ctrl-C during
an answer stops that answer; Ctrl-C or Ctrl-D at the prompt leaves.
"""

from __future__ import annotations

import argparse
import sys
from typing import Iterator

from speczoo.commands._model_args import add_model_args, draft_for, eagle_for, spec_mode

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with a model in the terminal (streaming, multi-turn)",
                       description="Multi-turn chat through the model's chat template. Commands: "
                       "/spec on|off|ngram|draft|auto, /stats, /reset, /save FILE, /help, /quit.")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"zoo name (default {DEFAULT_MODEL})")
    add_model_args(p)
    p.add_argument("--spec", default="auto", help="on, off, ngram, draft, draft:NAME, eagle[:NAME], "
                   "eagle-tree[:NAME] or auto (default auto); draft, auto and on load the zoo's draft for MODEL "
                   "unless --draft names one; eagle uses the newest EAGLE head for MODEL unless NAME names one")
    p.add_argument("--max-tokens", type=int, default=512, help="tokens per answer at most")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--system", default=None, help="a system message to start the conversation")
    p.add_argument("--no-think", action="store_true",
                   help="pre-fill an empty <think></think> block (reasoning models answer directly)")
    p.set_defaults(func=run)


def _terminal_lines() -> Iterator[str]:
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    while True:
        try:
            yield input("\n› ")
        except EOFError:
            return


def run(args: argparse.Namespace) -> int:
    from speczoo.chat import ChatSession
    from speczoo.runtime import load_runtime

    runtime = load_runtime(args.model, draft=draft_for(args.model, args.spec, args.draft),
                           backend=args.backend, max_seq=args.max_seq, kv_type=args.kv_type,
                           eagle_head=eagle_for(args.spec), draft_vocab=args.draft_vocab)
    session = ChatSession(runtime, spec=spec_mode(args.spec), max_tokens=args.max_tokens,
                          temperature=args.temperature, seed=args.seed, system=args.system,
                          no_think=args.no_think, out=sys.stdout)
    print(f"speczoo chat with {runtime.name} (spec: {session.spec}); /help for commands, /quit to leave")
    try:
        session.feed(_terminal_lines())
    except KeyboardInterrupt:
        print()
    return 0
