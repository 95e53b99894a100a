"""Token ids equal llama.cpp's.

1. Every vocabulary test llama.cpp ships (its vocab-only GGUFs with the ids it expects for ~47 texts each:
   whitespace runs, digits, CJK, Khmer, emoji, code, contractions), tokenized by the tokenizer speczoo
   builds from the same GGUF, text for text. The files come from llama.cpp's source tree
   (tests/llama_vocabs.py says where); without them these tests skip, saying how to fetch them; CI
   fetches them and fails if they are missing.
2. (real) The real GGUFs here (SmolLM2, Qwen2.5-Coder, Gemma 3) on a multilingual + code + emoji text
   and on 30,000 characters of Python's standard library, against the ids llama.cpp's `llama-tokenize`
   gave for the same file (tests/data/llama_tokenize.json, recorded by benchmarks/llama_tokenize_ids.py),
   built straight from the GGUF and again after a save/load round trip through a bundle's files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from llama_vocabs import FETCH_HINT, all_vocab_names, cases, gguf_path, vocab_dir, vocab_names
from real_ggufs import NAMES, real_gguf

from speczoo.tokenizer import Tokenizer
from speczoo.zoo.gguf_metadata import read_gguf_metadata
from speczoo.zoo.gguf_tokenizer import read_tokenizer, tokenizer_from_metadata
from speczoo.zoo.source import sha256_file
from speczoo.zoo.tokparity import ids_digest, stdlib_texts, texts_digest

DATA = Path(__file__).parents[1] / "data"
REGENERATE = "regenerate tests/data/llama_tokenize.json with benchmarks/llama_tokenize_ids.py"

VOCABS = vocab_dir()
# Vocabularies speczoo refuses, with the words its error must use (encoder-only models: no generation).
UNSUPPORTED = {"bert-bge": "'bert' is not supported", "nomic-bert-moe": "'t5' is not supported"}
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


@pytest.mark.parametrize("name", all_vocab_names(VOCABS) if VOCABS else ["(absent)"])
def test_bos_eos_and_ends_of_generation_equal_llama_cpp(name):
    """What the vocabulary tests leave out: the BOS/EOS llama.cpp adds (its ids for "Hello world" with
    specials) and the ids that end a generation there (llama-tokenize's, recorded)."""
    if VOCABS is None:
        pytest.skip(ABSENT)
    meta = read_gguf_metadata(gguf_path(VOCABS, name))
    if name in UNSUPPORTED:
        with pytest.raises(ValueError, match=UNSUPPORTED[name]):
            tokenizer_from_metadata(meta)
        return
    expected = _recorded()["vocabs"][name]
    built = tokenizer_from_metadata(meta)
    assert built.tokenizer.encode("Hello world").ids == [int(i) for i in expected["with_specials"].split()]
    assert sorted(built.config["eos_ids"]) == [int(i) for i in expected["eog"].split()]


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


# ---------------------------------------------------------------- the real files, against llama-tokenize

def _recorded() -> dict:
    return json.loads((DATA / "llama_tokenize.json").read_text(encoding="utf-8"))


def _first_difference(ours: list[int], theirs: list[int]) -> str:
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    return f"at id {k}: speczoo {ours[k:k + 8]} llama.cpp {theirs[k:k + 8]}"


@pytest.mark.real
@pytest.mark.parametrize("name", NAMES)
def test_real_files_ids_equal_llama_tokenize(name, tmp_path):
    record = _recorded()
    entry = record["models"][name]
    path = real_gguf(name)
    assert sha256_file(path) == entry["gguf_sha256"], f"{path} is not the file recorded; {REGENERATE}"
    with open(DATA / "tokenizer_sample.txt", encoding="utf-8", newline="") as f:
        sample = f.read()
    assert hashlib.sha256(sample.encode()).hexdigest() == record["sample_sha256"], REGENERATE
    stdlib = stdlib_texts(record["stdlib_chars"])
    assert texts_digest(stdlib) == record["stdlib_sha256"], f"this Python's standard library differs; {REGENERATE}"
    built = read_tokenizer(path)
    built.save(tmp_path)
    for tok in (built, Tokenizer.from_bundle(tmp_path)):
        expected = [int(i) for i in entry["sample_ids"].split()]
        ids = tok.encode(sample)
        assert ids == expected, _first_difference(ids, expected)
        assert tok.decode(ids) == sample
        dec = tok.incremental_decoder()
        assert "".join(dec.feed(i) for i in ids) + dec.flush() == sample        # streamed, never half a char
        stdlib_ids = [tok.encode(t) for t in stdlib]
        assert (sum(map(len, stdlib_ids)), ids_digest(stdlib_ids)) == (entry["stdlib_ids"], entry["stdlib_digest"])
