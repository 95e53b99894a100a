"""The `speczoo` command: thin. It only parses arguments and calls library code.

Each subcommand lives in its own module under `speczoo.commands` (see that package's docstring).
Every command takes `--threads N` (speczoo/threads.py: --threads, else $OMP_NUM_THREADS, else the
physical cores), applied here before the command runs. Errors a user can fix (`SpeczooError`,
`ValueError`, `FileNotFoundError`) are printed as one clear line and exit with status 2; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from speczoo import __version__, commands
from speczoo.commands._model_args import add_threads_arg
from speczoo.errors import SpeczooError
from speczoo.threads import apply_threads


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speczoo", description="Lossless speculative decoding for local LLMs on the CPU.")
    parser.add_argument("--version", action="version", version=f"speczoo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):      # shared helpers, not commands
            continue
        module = importlib.import_module(f"speczoo.commands.{info.name}")
        module.register(sub)
    for p in sub.choices.values():
        try:
            add_threads_arg(p)
        except argparse.ArgumentError:      # the command defines its own --threads (peers)
            pass
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        apply_threads(args.threads)
        return int(args.func(args) or 0)
    except (SpeczooError, ValueError, FileNotFoundError) as exc:
        print(f"speczoo {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
