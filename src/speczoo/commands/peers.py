"""`speczoo peers TARGET`: the same questions through llama.cpp, transformers and speczoo, side by side."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "peers", help="compare speczoo with llama.cpp and transformers on the same GGUF and prompts",
        description="Run the first turn of each question through llama.cpp's llama-server (greedy, "
                    "--spec-type ngram-mod, ngram-simple, and a draft model: one server per mode; build it with "
                    "benchmarks/build_llama.sh), transformers in bf16 (greedy, prompt lookup, assistant model) and "
                    "speczoo (off, ngram, draft, auto), all on the GGUF the bundle was pulled from, with the same "
                    "prompt ids, greedy, the same threads. Writes OUT/peers.jsonl and OUT/peers.md and prints the "
                    "table. transformers is an optional extra: pip install -e '.[peers]'.")
    p.add_argument("target", help="zoo name of the target model (pulled)")
    p.add_argument("--questions", default="builtin",
                   help="Spec-Bench JSON-lines file, or 'builtin' (default); only the first turn is run")
    p.add_argument("--draft", help="draft model (zoo name); default: the zoo's draft of the target")
    p.add_argument("--no-draft", action="store_true", help="run no draft-model systems")
    p.add_argument("--gen", type=int, default=96, help="max new tokens per answer (default 96)")
    p.add_argument("--limit", type=int, help="only the first N questions of each category")
    p.add_argument("--categories", help="comma-separated categories to run (default: all)")
    p.add_argument("--threads", type=int, default=2, help="threads for every system (default 2)")
    p.add_argument("--k", type=int, default=8, help="draft / prompt-lookup tokens per round (default 8)")
    p.add_argument("--warmup", type=int, default=4,
                   help="new tokens of one untimed answer per method before timing (default 4; 0: none)")
    p.add_argument("--systems",
                   help="comma-separated families or FAMILY:METHOD (llama, hf, vllm, speczoo; e.g. "
                        "llama:greedy,llama:ngram-mod,hf:greedy,speczoo); default: all that are installed")
    p.add_argument("--baseline", default="llama:greedy",
                   help="system the tok/s ratios are taken against (default llama:greedy)")
    p.add_argument("--backend", help="speczoo's linear backend (default: the runtime's choice)")
    p.add_argument("--llama-server", metavar="PATH", help="llama.cpp's llama-server (default: $SPECZOO_LLAMA_SERVER, "
                   "else llama-server on PATH, else /opt/llama-server-*/bin)")
    p.add_argument("--vllm", type=Path, metavar="VENV",
                   help="vLLM's own virtual environment (bash benchmarks/build_vllm.sh): adds the vllm family "
                        "(greedy, ngram, eagle3 with --vllm-head), one `vllm serve` per method on the GGUF "
                        "dequantized to the Hugging Face layout")
    p.add_argument("--vllm-head", metavar="NAME|DIR",
                   help="an EAGLE-3 head (installed name or folder, speculators format) for vllm:eagle3")
    p.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="what vLLM computes in (default bfloat16)")
    p.add_argument("--out", type=Path, required=True, help="output directory (peers.jsonl is rewritten)")
    p.add_argument("--quiet", action="store_true", help="no per-answer progress lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speczoo.bench.peers import (
        FAMILIES, REPORT_FILE, ROWS_FILE, PeerSettings, build_prompts, context_for, parse_systems, run_peers)
    from speczoo.bench.questions import load_questions, select
    from speczoo.tokenizer import Tokenizer
    from speczoo.zoo.bundle import find_bundle, source_gguf
    from speczoo.zoo.registry import default_draft

    if args.gen < 1 or args.k < 1 or args.threads < 1 or args.warmup < 0:
        raise ValueError("--gen, --k and --threads must be >= 1, --warmup >= 0")
    families = [f for f in FAMILIES if f != "vllm" or args.vllm]     # vLLM only where its venv is named
    systems = parse_systems(args.systems, families)
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    questions = select(load_questions(args.questions), categories, args.limit)
    bundle = find_bundle(args.target)
    draft = None if args.no_draft else (args.draft or default_draft(args.target))
    draft_gguf = source_gguf(find_bundle(draft)) if draft else None
    tokenizer = Tokenizer.from_bundle(bundle)
    head = None
    if args.vllm_head:
        from speczoo.zoo.heads import find_head

        head = find_head(args.vllm_head).path
    prompts = build_prompts(questions, tokenizer)
    settings = PeerSettings(target=args.target, target_gguf=source_gguf(bundle), eos_ids=tokenizer.eos_ids,
                            draft=draft, draft_gguf=draft_gguf, max_new_tokens=args.gen,
                            threads=args.threads, k=args.k, warmup=args.warmup,
                            n_ctx=context_for(prompts, args.gen, args.k), backend=args.backend,
                            llama_server=args.llama_server, tokenizer=tokenizer,
                            vllm_venv=args.vllm, vllm_head=head, vllm_dtype=args.vllm_dtype)
    import torch

    torch.set_num_threads(args.threads)
    outcome = run_peers(prompts, settings, args.out, systems=systems, baseline=args.baseline,
                        quiet=args.quiet)
    print(outcome.markdown)
    print(f"{len(outcome.rows)} rows in {outcome.out_dir / ROWS_FILE}; table in {outcome.out_dir / REPORT_FILE}")
    return 0
