"""Tokenizer parity: do speczoo's ids equal a reference's ids for the same GGUF, text for text?

The reference for ids is llama.cpp: `LlamaTokenize` runs its `llama-tokenize` tool on the GGUF (found in
SPECZOO_LLAMA_BIN or on PATH; benchmarks/build_llama.sh builds it). transformers'
`AutoTokenizer.from_pretrained(dir, gguf_file=name)` builds a tokenizer from the same metadata and agrees
with llama.cpp on most files, but not everywhere (it splits Gemma's runs of more than 31 spaces and
SmolLM2's digits otherwise). transformers is an optional extra (`pip install speczoo[check]`), imported
only when a check runs. This module measures; it never changes either tokenizer.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
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


def llama_tool(name: str) -> Path | None:
    """llama.cpp's tool `name` (e.g. llama-tokenize): in SPECZOO_LLAMA_BIN when set, else on PATH; None if absent."""
    folder = os.environ.get("SPECZOO_LLAMA_BIN")
    path = Path(folder) / name if folder else (Path(found) if (found := shutil.which(name)) else None)
    return path if path is not None and path.is_file() else None


class LlamaTokenize:
    """llama.cpp's tokenization of a GGUF through its `llama-tokenize` tool: the text as bytes from a file,
    no escape processing, special tokens parsed (as speczoo's encode does); BOS/EOS only with add_special."""

    def __init__(self, gguf_path: Path, binary: Path):
        self.gguf_path, self.binary = Path(gguf_path), Path(binary)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            cmd = [str(self.binary), "-m", str(self.gguf_path), "-f", f.name, "--ids", "--no-escape", "--log-disable"]
            out = subprocess.run(cmd + ([] if add_special_tokens else ["--no-bos"]), capture_output=True, text=True)
        if out.returncode != 0:
            raise SpeczooError(f"{self.binary.name} failed on {self.gguf_path.name} (exit {out.returncode}): "
                               f"{out.stderr.strip()[-500:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def llama_reference(gguf_path: Path) -> LlamaTokenize | None:
    """llama.cpp's tokenizer of the GGUF when its llama-tokenize is found (see `llama_tool`), else None."""
    binary = llama_tool("llama-tokenize")
    return None if binary is None else LlamaTokenize(gguf_path, binary)


def _show(ours: Tokenizer, text: str, a: list[int], b: list[int]) -> str:
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    pos = len(ours.decode(a[:k]))
    return (f"at id {k} (char {pos}), text {text[max(0, pos - 40):pos + 40]!r}: "
            f"ours {a[k:k + 6]} vs reference {b[k:k + 6]}")


def tokenizer_parity(ours: Tokenizer, gguf_path: Path | None, text: str | Iterable[str], add_special: bool = False,
                     reference=None) -> TokParity:
    """Compare ids text by text against `reference` (anything with transformers' `encode(text,
    add_special_tokens=...)`: `LlamaTokenize`, or by default transformers' tokenizer of `gguf_path`)."""
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


def ids_digest(ids_per_text: list[list[int]]) -> str:
    """One sha256 for the ids of many texts (the compact JSON of the nested list): a recorded reference."""
    return hashlib.sha256(json.dumps(ids_per_text, separators=(",", ":")).encode()).hexdigest()


def texts_digest(texts: list[str]) -> str:
    """One sha256 for many texts: shows that a recorded reference was made on the same texts."""
    return hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode()).hexdigest()


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
