"""`speczoo serve-load [MODEL]`: N concurrent streaming clients on the server; identical answers and the
aggregate tok/s. The measurement lives in `speczoo.bench.serve_load`."""

from __future__ import annotations

import argparse

from speczoo.commands._model_args import add_model_args, draft_for, spec_mode

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-load", help="concurrent streaming clients on the server: identical "
                       "answers and aggregate tok/s",
                       description="Serve MODEL on a loopback port, send each client's chat request "
                       "alone, then all at once; check every answer equals its lone twin and print the "
                       "aggregate tok/s.")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"zoo name (default {DEFAULT_MODEL})")
    p.add_argument("--clients", default="8", help="concurrent streaming clients, or a list run in turn, "
                   "e.g. 1,2,4,8 (default 8)")
    p.add_argument("--parallel", type=int, default=1, help="generations the server batches at once "
                   "(speczoo serve --parallel; default 1: one at a time)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (default 64)")
    p.add_argument("--llama-server", metavar="PATH", help="llama.cpp's llama-server, run on the same GGUF "
                   "and requests with --parallel the same, for a side-by-side figure (default: "
                   "$SPECZOO_LLAMA_SERVER, else llama-server on PATH, else /opt/llama-server-*/bin; "
                   "'off': speczoo only)")
    p.add_argument("--llama-modes", help="llama-server modes, each a fresh server on the same requests: greedy, "
                   "ngram-mod, ngram-simple, draft (default: all, draft only when the model has a draft model; "
                   "greedy is required: the others' answers are checked against it)")
    p.add_argument("--spec", default="auto", help="speculative mode of every request, or a list run in "
                   "turn at each client count with the ratio to the first, e.g. off,auto (default auto)")
    p.add_argument("--category", default=None, help="take the prompts from this category of the built-in "
                   "questions, e.g. code_edit (default: short coding requests)")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speczoo.bench.serve_load import run_serve_load
    from speczoo.runtime import load_runtime

    specs = [s for s in str(args.spec).split(",") if s]
    drafts = {draft_for(args.model, s, args.draft) for s in specs} - {None}
    if len(drafts) > 1:
        raise ValueError(f"--spec {args.spec} needs different drafts ({', '.join(sorted(drafts))}); give one")
    modes = _llama_modes(args)            # checked before the model loads
    runtime = load_runtime(args.model, draft=next(iter(drafts), None), backend=args.backend,
                           max_seq=args.max_seq, kv_type=args.kv_type, draft_vocab=args.draft_vocab)
    counts = [int(c) for c in str(args.clients).split(",")]
    llama = _llama_comparison(args, runtime, modes)
    alone: dict[str, list] = {}
    ok = True
    for n in counts:
        first, runs = None, []
        for spec in specs:
            res = run_serve_load(runtime, clients=n, max_tokens=args.max_tokens, spec=spec_mode(spec),
                                 parallel=args.parallel, alone=alone.get(spec), category=args.category)
            if len(res.alone) > len(alone.get(spec, [])):
                alone[spec] = res.alone
            ok = ok and res.ok
            for line in res.lines():
                print(line)
            first = first or res
            if res is not first:
                print(f"{spec}/{first.spec} aggregate at {n} clients: "
                      f"{res.aggregate_tok_s / first.aggregate_tok_s:.2f}x")
            runs.append(res)
        for line in llama.compare(runs) if llama else []:
            print(line)
    return 0 if ok else 1


def _llama_modes(args: argparse.Namespace) -> list[str]:
    from speczoo.bench.llama_modes import default_modes, parse_modes
    from speczoo.zoo.registry import default_draft

    has_draft = (args.draft or default_draft(args.model)) is not None
    return parse_modes(args.llama_modes or default_modes(has_draft), has_draft=has_draft)


def _llama_comparison(args: argparse.Namespace, runtime, modes: list[str]):
    """llama-server on the model's GGUF, None (and one line that says why) when it cannot run."""
    from speczoo.bench.serve_load_llama import LlamaComparison, find_llama_server
    from speczoo.errors import SpeczooError
    from speczoo.threads import resolve_threads
    from speczoo.zoo.bundle import find_bundle, source_gguf
    from speczoo.zoo.registry import default_draft

    if args.llama_server == "off":
        return None
    draft = args.draft or default_draft(args.model)
    binary = find_llama_server(args.llama_server)
    if binary is None:
        print("llama-server: none found (--llama-server PATH, $SPECZOO_LLAMA_SERVER, PATH, "
              "/opt/llama-server-*/bin; build llama.cpp's llama-server target to compare); speczoo only")
        return None
    try:
        gguf = source_gguf(find_bundle(args.model))
    except (SpeczooError, ValueError, FileNotFoundError) as exc:
        print(f"llama-server: not run, {args.model} has no GGUF to give it ({exc}); speczoo only")
        return None
    draft_gguf = None
    if "draft" in modes:
        try:
            draft_gguf = source_gguf(find_bundle(draft))
        except (SpeczooError, ValueError, FileNotFoundError) as exc:
            if args.llama_modes:
                raise
            print(f"llama-server: its draft mode not run, the draft {draft} has no GGUF to give it ({exc})")
            modes.remove("draft")
    return LlamaComparison(binary=binary, gguf=gguf, parallel=args.parallel, slot_ctx=runtime.max_seq,
                           threads=resolve_threads(args.threads), alias=runtime.name, modes=tuple(modes),
                           draft_gguf=draft_gguf)
