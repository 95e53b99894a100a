"""`speczoo suite TARGET`: every question × every method on one runtime → results, summary, plot."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from speczoo.commands._model_args import draft_for, eagle_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "suite", help="benchmark decoding methods over a Spec-Bench question set (resumable)",
        description="Generate every question with every method on the same runtime; write "
                    "OUT/results.jsonl (one row per question and method, appended as it goes: rerun "
                    "the same command to resume), OUT/summary.md and OUT/speedup.png.")
    p.add_argument("target", help="zoo name of the target model")
    p.add_argument("--questions", default="builtin",
                   help="Spec-Bench JSON-lines file, 'builtin' for the built-in set (default), or 'agentic' for "
                        "agentic traces built now from the standard library's files (edit chains, tool "
                        "results quoted back, JSON tool calls)")
    p.add_argument("--methods",
                   help="comma-separated: off, ngram, draft, draft:NAME, auto, eagle:NAME (off is required and "
                        "runs first; default off,ngram,auto; with --endpoint and no --methods, no local run)")
    p.add_argument("--gen", type=int, default=256, help="max new tokens per turn (default 256)")
    p.add_argument("--limit", type=int, help="only the first N questions of each category")
    p.add_argument("--categories", help="comma-separated categories to run (default: all)")
    p.add_argument("--k", type=int, default=8, help="max draft tokens per round (default 8)")
    p.add_argument("--ngram", type=int, default=3, help="max n-gram order for prompt lookup (default 3)")
    p.add_argument("--draft", help="draft model to load (default: the NAME of a draft:NAME method, else the zoo's draft "
                   "of the target for the draft and auto methods)")
    p.add_argument("--backend", help="linear backend of the runtime (default: the runtime's choice)")
    p.add_argument("--max-seq", type=int, default=4096, help="KV cache length (default 4096)")
    p.add_argument("--llama-server", nargs="?", const="", metavar="PATH",
                   help="also run llama.cpp's llama-server on the bundle's GGUF, fed the same prompt ids, one "
                        "server per --llama-modes mode (PATH, else $SPECZOO_LLAMA_SERVER, llama-server on "
                        "PATH, /opt/llama-server-*/bin)")
    p.add_argument("--llama-modes",
                   help="llama-server modes: greedy, ngram-mod, ngram-simple, draft (default: all, draft only when "
                        "the target has a draft model)")
    p.add_argument("--llama-draft-max", type=int, default=None, metavar="N",
                   help="--spec-draft-n-max of llama-server's draft mode (default 7, llama.cpp's own recipe)")
    p.add_argument("--interleave", nargs="?", const="category", choices=("category", "question"), default=None,
                   help="with --llama-server: each category's speczoo methods, then its llama-server modes, "
                        "before the next category, so that the machine's speed drifting over a long run falls "
                        "on both alike; `--interleave question` alternates them question by question, so the "
                        "two systems' answers to a question run within a minute or two of each other, each "
                        "llama-server mode then starting once a question. Default: every speczoo row, then every "
                        "llama-server row")
    p.add_argument("--endpoint", action="append", metavar="URL[,SYSTEM:MODE[,KEY=VALUE...]]",
                   help="also run an OpenAI-compatible server (llama-server, vLLM, speczoo serve) by URL, repeatable; "
                        "the label names its rows (default serverN:greedy); a mode greedy or off marks its system's "
                        "greedy, which the system's other modes must equal; KEY=VALUE are extra request fields "
                        "(e.g. speculative=ngram for speczoo serve); $OPENAI_API_KEY is sent as its key")
    p.add_argument("--endpoint-prompt", choices=("text", "ids"), default="text",
                   help="what a server is sent as the /v1/completions prompt: the chat template's text (default; "
                        "every server takes it) or its ids by the target's tokenizer")
    p.add_argument("--out", type=Path, required=True, help="output directory (resumed if it has rows)")
    p.add_argument("--no-plot", action="store_true", help="skip speedup.png (no matplotlib needed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def draft_to_load(target: str, methods: list[str], explicit: str | None) -> str | None:
    """The one draft model the runtime must load: --draft, the NAME of draft:NAME methods, or, for the
    draft and auto methods, the zoo's default draft of the target (as bench, generate, chat and serve)."""
    names = {n for m in methods for n in [draft_for(target, m, explicit)] if n is not None}
    if len(names) > 1:
        raise ValueError(f"one runtime loads one draft model; got {', '.join(sorted(names))}: run the suite once "
                         "per draft model into the same --out (rows are kept) instead")
    return names.pop() if names else None


def head_to_load(methods: list[str]) -> str | None:
    """The one EAGLE head the runtime must load: the NAME of eagle:NAME / eagle-tree:NAME methods (None:
    the newest installed for the target, if any). A runtime resolves its head once, at load."""
    names = {n for m in methods for n in [eagle_for(m)] if n is not None}
    if len(names) > 1:
        raise ValueError(f"one runtime loads one EAGLE head; got {', '.join(sorted(names))}: run the suite once "
                         "per head into the same --out (rows are kept) instead")
    return names.pop() if names else None


def questions_of(source: str):
    from speczoo.bench import agentic
    from speczoo.bench.questions import load_questions

    return agentic.agentic_questions() if source == agentic.NAME else load_questions(source)


def llama_settings(args: argparse.Namespace):
    """What llama-server runs with (binary, GGUFs, threads, modes); None without --llama-server."""
    from speczoo.bench.llama_modes import DRAFT_N_MAX, default_modes, parse_modes
    from speczoo.bench.serve_load_llama import find_llama_server
    from speczoo.bench.suite_llama import LlamaSuiteSettings
    from speczoo.threads import resolve_threads
    from speczoo.zoo.bundle import find_bundle, source_gguf
    from speczoo.zoo.registry import default_draft

    if args.llama_server is None:
        return None
    binary = find_llama_server(args.llama_server or None)
    if binary is None:
        raise FileNotFoundError("--llama-server: no llama-server found (give its PATH, or set "
                                "$SPECZOO_LLAMA_SERVER; bash benchmarks/build_llama.sh builds one)")
    draft = args.draft or default_draft(args.target)
    modes = parse_modes(args.llama_modes or default_modes(draft is not None), has_draft=draft is not None)
    return LlamaSuiteSettings(
        binary=binary, gguf=source_gguf(find_bundle(args.target)), threads=resolve_threads(args.threads),
        modes=modes, draft_gguf=source_gguf(find_bundle(draft)) if "draft" in modes else None,
        draft_max=args.llama_draft_max or DRAFT_N_MAX)


def run(args: argparse.Namespace) -> int:
    from speczoo.bench import peers_table
    from speczoo.bench.endpoint import parse_endpoint
    from speczoo.bench.suite_endpoint import references
    from speczoo.bench.questions import categories_of, select
    from speczoo.bench.suite import OFF, SUMMARY, SuiteSettings, parse_methods, suite_notes, write_reports

    if args.gen < 1 or args.k < 1 or args.ngram < 1:
        raise ValueError("--gen, --k and --ngram must be >= 1")
    endpoints = [parse_endpoint(spec, i) for i, spec in enumerate(args.endpoint or [], start=1)]
    references(endpoints)                  # every system has its greedy, before anything runs
    methods = parse_methods(args.methods or "off,ngram,auto") if args.methods or not endpoints else []
    if args.llama_server is not None and not methods:
        raise ValueError("--llama-server is fed the prompt ids speczoo's off was fed: add --methods off (or more)")
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    questions = select(questions_of(args.questions), categories, args.limit)
    llama = llama_settings(args)
    if args.interleave and llama is None:
        raise ValueError("--interleave alternates speczoo's rows with llama-server's by category or question: give "
                         "--llama-server")
    settings = SuiteSettings(methods=methods, max_new_tokens=args.gen, k=args.k, ngram=args.ngram)
    target, ran = args.target, 0
    if methods:
        runtime, outcome = run_local(args, questions, settings, llama if args.interleave else None)
        tokenizer, rows, ran = runtime.tokenizer, list(outcome.rows), outcome.ran
        notes = suite_notes(runtime.name, settings, questions)
    else:
        from speczoo.tokenizer import Tokenizer
        from speczoo.zoo.bundle import find_bundle

        tokenizer, rows = Tokenizer.from_bundle(find_bundle(args.target)), []
        notes = [f"target: {target} (its chat template renders every server's prompts); questions: "
                 f"{len(questions)}, max new tokens per turn: {args.gen}"]
    appendix = []
    if llama is not None:
        from speczoo.bench.suite_llama import render_versus, run_llama_modes

        llama_rows = run_llama_modes(tokenizer, questions, settings, target, llama, args.out)
        rows += llama_rows
        notes.append(f"llama-server: {llama.binary}, modes {', '.join(llama.modes)}, {llama.threads} threads, "
                     f"GGUF {llama.gguf}" + (f", draft {llama.draft_gguf} (--spec-draft-n-max {llama.draft_max})"
                                             if llama.draft_gguf else ""))
        appendix.append(lambda summary, rs=list(rows): render_versus(summary, rs))
    base = OFF
    if endpoints:
        from speczoo.bench.suite_endpoint import render_streamed, run_endpoints

        endpoint_rows = run_endpoints(tokenizer, questions, settings, target, endpoints, args.out,
                                      prompt=args.endpoint_prompt)
        rows += endpoint_rows
        notes.append("servers by URL: " + ", ".join(f"{e.label} {e.base_url}" for e in endpoints)
                     + f"; prompts sent as {args.endpoint_prompt}")
        appendix.append(lambda summary: render_streamed(endpoint_rows))
        base = OFF if methods else references(endpoints)[endpoints[0].label]
    write_reports(args.out, rows, questions, notes, plot=not args.no_plot, base=base,
                  appendix=lambda summary: "".join(a(summary) for a in appendix))
    print((args.out / SUMMARY).read_text(encoding="utf-8"))
    if llama is not None or endpoints:
        table = peers_table.render(rows, categories_of(questions), notes=notes)
        tmp = args.out / (peers_table.FILE + ".tmp")
        tmp.write_text(table, encoding="utf-8")
        tmp.replace(args.out / peers_table.FILE)
        print(table)
    print(f"{ran} rows generated by speczoo here; results in {args.out}")
    return 0


def run_local(args: argparse.Namespace, questions, settings, interleave=None):
    """speczoo's own methods on the loaded target (reports are written once every system has run):
    (the runtime, the suite's outcome, its `ran` counting every row generated here). interleave: the
    llama-server settings to run each category's modes with right after that category's speczoo rows
    (--interleave), or each question's right after its own (--interleave question); None: speczoo's rows
    only, llama-server's come after them all."""
    from speczoo.bench.questions import categories_of
    from speczoo.bench.suite import run_suite
    from speczoo.runtime import load_runtime

    runtime = load_runtime(args.target, draft=draft_to_load(args.target, settings.methods, args.draft),
                           backend=args.backend, max_seq=args.max_seq, eagle_head=head_to_load(settings.methods))
    settings.backend = runtime.target.backend
    ran = 0
    if interleave is not None:
        from speczoo.bench.suite_llama import run_llama_modes

        groups = [[q] for q in questions] if args.interleave == "question" else \
            [[q for q in questions if q.category == cat] for cat in categories_of(questions)]
        for group in groups:
            ran += run_suite(runtime, group, settings, args.out, progress=not args.no_progress, plot=False).ran
            run_llama_modes(runtime.tokenizer, group, settings, runtime.name, interleave, args.out)
    outcome = run_suite(runtime, questions, settings, args.out, progress=not args.no_progress, plot=False)
    return runtime, replace(outcome, ran=ran + outcome.ran)
