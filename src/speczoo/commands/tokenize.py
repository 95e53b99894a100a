"""`speczoo tokenize MODEL (--text T | --file F) [--chat]`: print the ids, or check tokenizer parity.

Only parses arguments and calls speczoo.tokenizer / speczoo.zoo.tokparity. Ids go to stdout as one line
of space-separated ints; --parity compares against transformers' tokenizer of the bundle's source GGUF.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from speczoo.tokenizer import Tokenizer
from speczoo.zoo.bundle import find_bundle, source_gguf


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenize", help="print the token ids of a text (or check tokenizer parity)",
                       description="Tokenize with a pulled model's tokenizer. --chat renders the text as "
                                   "one user message through the chat template, generation prompt appended.")
    p.add_argument("model", help="zoo name, bundle directory or pulled local source")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text")
    src.add_argument("--file", type=Path, help="read the text from this file")
    src.add_argument("--parity", action="store_true",
                     help="compare ids with transformers' tokenizer of the source GGUF on real text "
                          "(Python stdlib sources and docstrings; needs transformers)")
    p.add_argument("--chat", action="store_true", help="wrap the text as a user message in the chat template")
    p.add_argument("--add-special", action="store_true", help="add BOS where the model's file asks for it")
    p.add_argument("--parity-chars", type=int, default=200_000, help="characters of real text for --parity")
    p.add_argument("--parity-dir", type=Path, default=None, help="directory of .py files for --parity")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    bundle = find_bundle(args.model)
    tok = Tokenizer.from_bundle(bundle)
    if args.parity:
        return _parity(tok, bundle, args)
    text = args.text if args.text is not None else args.file.read_text(encoding="utf-8")
    if args.chat:
        ids = tok.chat_ids([{"role": "user", "content": text}])
    else:
        ids = tok.encode(text, add_special=args.add_special)
    print(" ".join(map(str, ids)))
    return 0


def _parity(tok: Tokenizer, bundle: Path, args: argparse.Namespace) -> int:
    from speczoo.zoo.tokparity import STDLIB_DIR, stdlib_texts, tokenizer_parity
    texts = stdlib_texts(args.parity_chars, args.parity_dir or STDLIB_DIR)
    t0 = time.perf_counter()
    result = tokenizer_parity(tok, source_gguf(bundle), texts, add_special=args.add_special)
    print(f"{args.model}: {result.summary()} [{time.perf_counter() - t0:.1f} s]")
    return 0 if result.mismatching == 0 else 1
