"""`speczoo alpha FILE...`: the model-free prompt-lookup acceptance proxy (see speczoo.bench.alpha)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "alpha", help="model-free proxy: how much would n-gram prompt lookup accept on these texts?",
        description="Treat each file's text as a model's output, replay a prompt-lookup drafter over it "
                    "and report accepted tokens per round, the fraction of positions the drafter "
                    "covered and E[tokens per round], per file and per n-gram order. Tokens are word "
                    "pieces (runs of word characters or single punctuation marks, leading whitespace "
                    "attached) unless --model or --tokenizer names a real tokenizer.")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--ngram", default="1..4",
                   help="maximum n-gram order(s) to try: N, LO..HI or N,N,... (default 1..4); each "
                        "order falls back to shorter ones")
    p.add_argument("--k", type=int, default=8, help="maximum draft tokens per round (default 8)")
    p.add_argument("--model", help="tokenize with this pulled zoo model's tokenizer")
    p.add_argument("--tokenizer", type=Path, help="tokenize with this tokenizer.json or .gguf file")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speczoo.bench import alpha

    if args.model and args.tokenizer:
        raise ValueError("give --model or --tokenizer, not both")
    if args.k < 1:
        raise ValueError(f"--k must be >= 1, got {args.k}")
    orders = alpha.parse_orders(args.ngram)
    if args.model:
        tokenize = alpha.tokenizer_for_model(args.model)
    elif args.tokenizer:
        tokenize = alpha.tokenizer_from_file(args.tokenizer)
    else:
        tokenize = alpha.word_piece_ids
    texts = {}
    for path in args.files:
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist or is not a file")
        texts[str(path)] = path.read_text(encoding="utf-8", errors="replace")
    results = alpha.alpha_for_texts(texts, orders, args.k, tokenize)
    print(alpha.results_json(results) if args.json else alpha.render_table(results))
    return 0
