"""Write the perplexity text of docs/results.md: the docstrings of a few standard-library modules.

    python -m benchmarks.ppl_text OUT.txt

The docstrings (module, classes, functions, in source order, read with `ast`, nothing imported) of
MODULES from the running Python's standard library, separated by blank lines: English prose about code,
the text issue #28 measured on. The same Python version gives the same file.
This module is a measurement script: the runtime never imports it.
"""

from __future__ import annotations

import argparse
import ast
import sys
import sysconfig
from pathlib import Path

MODULES = ("textwrap", "functools", "heapq", "bisect", "argparse", "json/__init__", "pathlib", "shutil")


def docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return [d for d in (ast.get_docstring(n) for n in nodes) if d]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the text file to write")
    out = p.parse_args(argv).out
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [d for m in MODULES if (root / f"{m}.py").is_file() for d in docstrings(root / f"{m}.py")]
    out.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    print(f"{out}: {len(parts)} docstrings, {sum(map(len, parts))} characters (Python {sys.version.split()[0]})")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
