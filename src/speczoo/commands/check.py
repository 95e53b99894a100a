"""`speczoo check MODEL`: the parity gate (our fp32 vs transformers on the same GGUF; fast backend vs fp32;
tokenizer ids). Exits 1 when parity fails. MODEL is a pulled zoo name, a bundle directory or a .gguf path.
`speczoo check MODEL --ppl FILE` instead measures the perplexity on FILE beside llama.cpp's on the same GGUF
and ids (speczoo.bench.ppl_check); it exits 1 when a goal against llama.cpp is missed.

A bundle keeps no fp32 weights: our fp32 side is rebuilt from the bundle's source GGUF (a zoo model's is
assembled again from its installed packages into the zoo's downloads, where the next `speczoo pull`
removes it). Only parses arguments and calls speczoo.bench.parity."""

from __future__ import annotations

from speczoo.context import DEFAULT_KV_TYPE, KV_TYPES


def register(sub) -> None:
    p = sub.add_parser("check", help="parity gate: our model vs transformers on the same GGUF, and the fast "
                                     "backend vs fp32")
    p.add_argument("model", help="zoo name (pulled), bundle directory, or path to a .gguf file")
    p.add_argument("--tokens", type=int, default=640, help="positions of real text to compare (default 640)")
    p.add_argument("--chunk", type=int, default=128, help="prefill chunk of our model (default 128)")
    p.add_argument("--backend", default=None,
                   help="fast linear backend to compare with fp32 (default: the bundle's, else kernels' "
                        "DEFAULT_FAST_BACKEND)")
    p.add_argument("--text", default=None, help="text file to use instead of standard-library sources")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the transformers model (tokenizer still comes from transformers)")
    p.add_argument("--tie-gap", type=float, default=1e-3,
                   help="reference top-2 gaps at or below this count as near-ties (default 1e-3)")
    p.add_argument("--min-agreement", type=float, default=0.90,
                   help="fast-vs-fp32 top-1 agreement needed to pass (default 0.90: a quantized backend "
                        "loses some; a broken kernel falls far below)")
    p.add_argument("--max-ppl-ratio", type=float, default=1.08,
                   help="largest fast/fp32 perplexity ratio that passes (default 1.08)")
    g = p.add_argument_group("perplexity against llama.cpp (--ppl)")
    g.add_argument("--ppl", metavar="FILE", default=None,
                   help="measure the perplexity on FILE (llama-perplexity's protocol) with --backend (default: the "
                        "bundle's), the fp32 reference and llama.cpp on the same GGUF, instead of the parity gate")
    g.add_argument("--kv-type", choices=sorted(KV_TYPES), default=DEFAULT_KV_TYPE,
                   help=f"the backend's KV cache element type (default {DEFAULT_KV_TYPE}; the fp32 reference keeps "
                        "f32)")
    g.add_argument("--ctx", type=int, default=512, help="ids per chunk (llama-perplexity -c; default 512)")
    g.add_argument("--chunks", type=int, default=None, help="chunks to score (default: every whole chunk)")
    g.add_argument("--llama-bin", default=None,
                   help="folder of llama.cpp's llama-perplexity, llama-tokenize and llama-quantize (default: "
                        "$SPECZOO_LLAMA_BIN, PATH, then benchmarks/build_llama.sh's folder)")
    g.add_argument("--no-llama", action="store_true", help="speczoo's side only")
    g.add_argument("--llama-repack", action="store_true",
                   help="let llama.cpp repack the weights for its fast CPU layouts (default: --no-repack, its "
                        "plain path; its AMX layout crashes under some VMs)")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    if args.ppl is not None:
        from speczoo.bench.ppl_check import format_ppl_report, run_ppl_check

        report = run_ppl_check(args.model, Path(args.ppl), backend=args.backend, n_ctx=args.ctx,
                               n_chunks=args.chunks, llama_bin=args.llama_bin, llama=not args.no_llama,
                               llama_repack=args.llama_repack, kv_type=args.kv_type,
                               log=lambda line: print(f"... {line}", flush=True))
        print(format_ppl_report(report))
        return 0 if report.passed else 1
    from speczoo.bench.parity import format_report, run_parity

    text = Path(args.text).read_text() if args.text else None
    report = run_parity(args.model, n_tokens=args.tokens, chunk=args.chunk, tie_gap=args.tie_gap,
                        fast_backend=args.backend, reference=not args.no_reference, text=text,
                        min_agreement=args.min_agreement, max_ppl_ratio=args.max_ppl_ratio,
                        log=lambda line: print(f"... {line}", flush=True))
    print(format_report(report))
    return 0 if report.passed else 1
