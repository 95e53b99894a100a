"""`speczoo serve`: load one model and serve the OpenAI-compatible API and the web chat page.

Only parses arguments, loads the runtime and starts uvicorn; the app lives in `speczoo.serve.app`.
Binds to loopback unless --host says otherwise (and then warns when no --api-key protects it).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from speczoo.commands._model_args import add_model_args, draft_for, eagle_for, serves_by_name_in_batch, spec_mode
from speczoo.decoding.drafters.suffix_memory import SuffixMemory
from speczoo.decoding.tuning import DRAFTING

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API + web chat page",
                       description="Serve MODEL over /v1/chat/completions, /v1/completions and "
                       "/v1/models (streaming as server-sent events), with a chat page at /.")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"zoo name (default {DEFAULT_MODEL})")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this "
                   "machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--spec", default="auto", help="speculative mode when a request names none "
                   "(off, ngram, draft, draft:NAME, eagle[:NAME], eagle-tree[:NAME], auto; default auto); "
                   "draft and auto load the zoo's draft for MODEL unless --draft names one; eagle uses the "
                   "newest EAGLE head for MODEL unless NAME names one")
    p.add_argument("--max-queue", type=int, default=64, help="requests allowed to wait (then 503)")
    p.add_argument("--parallel", type=int, default=None, help="generations at once, in one batched forward "
                   "per step (default: as many KV slots of --max-seq as half the available memory holds, at "
                   "most 8; 1 when the default --spec needs a draft model or an EAGLE head, which do not batch)")
    p.add_argument("--suffix-memory-tokens", type=int, default=DRAFTING.suffix_memory_tokens, metavar="N",
                   help="the suffix drafter's memory of earlier answers holds at most N tokens, oldest evicted "
                   f"first (default {DRAFTING.suffix_memory_tokens}; 0: remember nothing)")
    p.add_argument("--pool-suffix-memory", action="store_true", help="let every API key's requests draft from "
                   "every key's earlier answers (default: each key drafts from its own only, since an answer's "
                   "speed reveals whether another's text matched)")
    p.set_defaults(func=run)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _worker(runtime, args: argparse.Namespace):
    """The batch worker for --parallel N > 1 (N from memory by default, said on stderr), else None (the
    app's one-at-a-time worker)."""
    from speczoo.serve.batch_worker import default_parallel, worker_for

    n, refusal = args.parallel, runtime.cannot_batch()
    if n is None:
        if refusal is not None:
            n, bound = 1, refusal
        elif not serves_by_name_in_batch(args.spec):
            n, bound = 1, "the default --spec does not batch"
        else:
            n, bound = default_parallel(runtime.slot_bytes())
        print(f"speczoo: --parallel {n}: {bound}", file=sys.stderr)
    if n < 1:
        raise ValueError(f"--parallel must be >= 1, got {n}")
    if n > 1 and refusal is not None:
        raise ValueError(f"--parallel {n}: {refusal}; serve it with --parallel 1")
    return worker_for(runtime, n, args.max_queue)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn
        from speczoo.serve.app import create_app
    except ImportError as exc:
        raise FileNotFoundError(f"the server needs its extra dependencies ({exc.name} is missing): "
                                f"pip install 'speczoo[serve]'") from exc
    from speczoo.runtime import load_runtime

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if not _is_loopback(args.host) and not args.api_key:
        print(f"speczoo serve: warning: binding {args.host} exposes the model to the network without "
              f"an API key; add --api-key KEY", file=sys.stderr)
    if args.suffix_memory_tokens < 0:
        raise ValueError(f"--suffix-memory-tokens must be >= 0, got {args.suffix_memory_tokens}")
    memory = SuffixMemory(args.suffix_memory_tokens, pooled=args.pool_suffix_memory)
    runtime = load_runtime(args.model, draft=draft_for(args.model, args.spec, args.draft),
                           backend=args.backend, max_seq=args.max_seq, kv_type=args.kv_type,
                           eagle_head=eagle_for(args.spec), suffix_memory=memory, draft_vocab=args.draft_vocab)
    worker = _worker(runtime, args)
    app = create_app(runtime, api_key=args.api_key, default_spec=spec_mode(args.spec),
                     max_queue=args.max_queue, worker=worker)
    print(f"speczoo: serving {runtime.name} (spec modes {', '.join(runtime.spec_modes)}) on "
          f"http://{args.host}:{args.port}/  (chat page at /, API at /v1, Ollama's API at /api, schema at /openapi.json)",
          file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
