"""Token ids equal llama.cpp's: every vocabulary test llama.cpp ships (its vocab-only GGUFs with the ids it
expects for ~47 texts each: whitespace runs, digits, CJK, Khmer, emoji, code, contractions) tokenized by
the tokenizer speczoo builds from the same GGUF, text for text.

The files come from llama.cpp's source tree (tests/llama_vocabs.py says where); without them these tests
skip, saying how to fetch them; CI fetches them and fails if they are missing.
"""

from __future__ import annotations

import pytest
from llama_vocabs import FETCH_HINT, cases, gguf_path, vocab_dir, vocab_names

from speczoo.zoo.gguf_metadata import read_gguf_metadata
from speczoo.zoo.gguf_tokenizer import tokenizer_from_metadata

VOCABS = vocab_dir()
# Vocabularies speczoo refuses, with the words its error must use (encoder-only models: no generation).
UNSUPPORTED = {"bert-bge": "'bert' is not supported"}
ABSENT = f"llama.cpp's vocabulary tests are not here; to run these tests: {FETCH_HINT}"


def _mismatches(name: str, meta: dict) -> list[str]:
    tok = tokenizer_from_metadata(meta).tokenizer
    bad = []
    for text, expected in cases(VOCABS, name):
        got = tok.encode(text, add_special_tokens=False).ids
        if got != expected:
            bad.append(f"{text[:60]!r}: llama.cpp {expected[:12]} speczoo {got[:12]}")
    return bad


@pytest.mark.parametrize("name", vocab_names(VOCABS) if VOCABS else ["(absent)"])
def test_ids_equal_llama_cpp(name):
    if VOCABS is None:
        pytest.skip(ABSENT)
    meta = read_gguf_metadata(gguf_path(VOCABS, name))
    if name in UNSUPPORTED:
        with pytest.raises(ValueError, match=UNSUPPORTED[name]):
            tokenizer_from_metadata(meta)
        return
    bad = _mismatches(name, meta)
    assert not bad, f"{len(bad)} of {len(cases(VOCABS, name))} texts differ from llama.cpp:\n" + "\n".join(bad)


@pytest.mark.parametrize("name, change", [
    ("llama-bpe", {"tokenizer.ggml.pre": "qwen2"}),              # Qwen's digits (one by one) on Llama 3
    ("llama-spm", {"tokenizer.ggml.add_space_prefix": False}),   # SentencePiece without its space prefix
    ("starcoder", {"tokenizer.ggml.pre": "gpt-2"}),              # digits not split first
])
def test_the_oracle_catches_a_wrong_tokenizer(name, change):
    """The same texts tell a wrong pre-tokenizer or flag apart: the parity above is not vacuous."""
    if VOCABS is None:
        pytest.skip(ABSENT)
    meta = {**read_gguf_metadata(gguf_path(VOCABS, name)), **change}
    assert _mismatches(name, meta)
