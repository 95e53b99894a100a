"""Tokenizer parity: do speczoo's ids equal transformers' ids for the same GGUF, text for text?

The reference is `AutoTokenizer.from_pretrained(dir, gguf_file=name)`, which builds its tokenizer from
the same GGUF metadata. transformers is an optional extra (`pip install speczoo[check]`): it is imported
only here and only when a parity check runs. This module measures; it never changes either tokenizer.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from speczoo.errors import SpeczooError
from speczoo.tokenizer import Tokenizer

STDLIB_DIR = Path("/root/.pyenv/versions/3.11.7/lib/python3.11")


@dataclass
class TokParity:
    texts: int                      # texts compared
    chars: int                      # characters in them
    ids: int                        # reference ids produced
    mismatching: int                # texts whose ids differ
    first_mismatch: str | None      # the first difference, shown in context

    @property
    def identical_fraction(self) -> float:
        return 1.0 - self.mismatching / self.texts if self.texts else 1.0

    def summary(self) -> str:
        s = (f"{self.texts} texts, {self.chars:,} chars, {self.ids:,} ids: "
             f"{100 * self.identical_fraction:.2f}% of texts id-identical ({self.mismatching} differ)")
        return s if self.first_mismatch is None else f"{s}\nfirst mismatch: {self.first_mismatch}"


def reference_tokenizer(gguf_path: Path):
    """transformers' tokenizer built from the GGUF (seconds: it parses the whole vocabulary)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SpeczooError("tokenizer parity needs transformers, an optional extra: "
                           "pip install 'speczoo[check]' (or pip install transformers)") from None
    gguf_path = Path(gguf_path)
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def _show(ours: Tokenizer, text: str, a: list[int], b: list[int]) -> str:
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    pos = len(ours.decode(a[:k]))
    return (f"at id {k} (char {pos}), text {text[max(0, pos - 40):pos + 40]!r}: "
            f"ours {a[k:k + 6]} vs reference {b[k:k + 6]}")


def tokenizer_parity(ours: Tokenizer, gguf_path: Path | None, text: str | Iterable[str], add_special: bool = False,
                     reference=None) -> TokParity:
    """Compare ids text by text against transformers' tokenizer of `gguf_path` (or a given `reference`)."""
    ref = reference if reference is not None else reference_tokenizer(gguf_path)
    texts = [text] if isinstance(text, str) else list(text)
    chars = n_ids = bad = 0
    first = None
    for t in texts:
        a = ours.encode(t, add_special=add_special)
        b = list(ref.encode(t, add_special_tokens=add_special))
        chars += len(t)
        n_ids += len(b)
        if a != b:
            bad += 1
            if first is None:
                first = _show(ours, t, a, b)
    return TokParity(texts=len(texts), chars=chars, ids=n_ids, mismatching=bad, first_mismatch=first)


def stdlib_texts(min_chars: int = 200_000, root: Path = STDLIB_DIR) -> list[str]:
    """Real text: whole Python stdlib modules, then their docstrings as separate texts, until min_chars."""
    files = sorted(root.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"no Python sources under {root}; pass another directory")
    texts: list[str] = []
    total = 0
    for f in files:
        src = f.read_text(encoding="utf-8", errors="replace")
        texts.append(src)
        try:
            tree = ast.parse(src)
        except SyntaxError:
            tree = None
        nodes = [] if tree is None else [n for n in ast.walk(tree) if isinstance(
            n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        docs = [d for d in (ast.get_docstring(n, clean=False) for n in nodes) if d]
        texts += docs
        total += len(src) + sum(len(d) for d in docs)
        if total >= min_chars:
            break
    return texts
