"""Record llama.cpp's token ids for the real-model tokenizer tests: tests/data/llama_tokenize.json.

    SPECZOO_LLAMA_BIN=/path/to/llama.cpp/build/bin python -m benchmarks.llama_tokenize_ids \\
        smollm2-135m=SmolLM2-135M-Instruct.Q4_1.gguf qwen2.5-coder-0.5b=... gemma-3-270m=...

For each GGUF (named as tests/real_ggufs.py names it): its sha256; llama.cpp's ids (`llama-tokenize`,
special tokens parsed, no BOS) for tests/data/tokenizer_sample.txt, in full; and for the first 30,000
characters of Python's standard library (`speczoo.zoo.tokparity.stdlib_texts(30_000)`, each text apart)
the number and the sha256 of the ids (`ids_digest`); the sample's and the texts' sha256 too. With
--compare it also prints speczoo's agreement. With --vocabs DIR, for each of llama.cpp's vocabulary GGUFs
there: the end-of-generation ids llama.cpp settles on and its ids for "Hello world" with BOS/EOS. An entry
not named again is kept. llama-tokenize comes from benchmarks/build_llama.sh.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
from pathlib import Path

from speczoo.zoo.gguf_tokenizer import read_tokenizer
from speczoo.zoo.source import sha256_file
from speczoo.zoo.tokparity import (LlamaTokenize, ids_digest, llama_reference, llama_tool, stdlib_texts, texts_digest,
                                   tokenizer_parity)

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SAMPLE = DATA / "tokenizer_sample.txt"
OUT = DATA / "llama_tokenize.json"
STDLIB_CHARS = 30_000
VOCAB_TEXT = "Hello world"


def _ids_text(ids: list[int]) -> str:
    """Ids as llama.cpp's .out files write them: one line, spaces between."""
    return " ".join(map(str, ids))


def llama_eog_ids(binary: Path, gguf_path: Path) -> list[int]:
    """The end-of-generation ids llama.cpp settles on for a GGUF, read from its load log (the log lists
    them before dropping a normal </s> or harmony's <|end|>, which it then says)."""
    out = subprocess.run([str(binary), "-m", str(gguf_path), "-p", "x", "--ids", "-lv", "5"],
                         capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr
    listed = {text: int(i) for i, text in re.findall(r"load:\s+- (\d+) \('(.*)'\)", log)}
    for text, said in (("</s>", "'</s>' is a normal token here"), ("<|end|>", "removing '<|end|>' token")):
        if said in log:
            listed.pop(text, None)
    return sorted(listed.values())


def record_vocabs(record: dict, folder: Path, binary: Path) -> None:
    """For each of llama.cpp's vocabulary GGUFs in `folder`: its end-of-generation ids and its ids for
    "Hello world" with BOS/EOS as the file asks (what its vocabulary tests leave out)."""
    for path in sorted(folder.glob("ggml-vocab-*.gguf")):
        name = path.name[len("ggml-vocab-"):-len(".gguf")]
        try:
            eog = llama_eog_ids(binary, path)
        except subprocess.CalledProcessError:
            continue                                 # a vocabulary llama.cpp itself cannot load
        hello = LlamaTokenize(path, binary).encode(VOCAB_TEXT, add_special_tokens=True)
        record.setdefault("vocabs", {})[name] = {"eog": _ids_text(eog), "with_specials": _ids_text(hello)}
        print(f"vocab {name}: eog {eog}, {VOCAB_TEXT!r} with specials {hello}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="NAME=PATH of each GGUF")
    ap.add_argument("--vocabs", type=Path, help="also llama.cpp's vocabulary GGUFs in this folder "
                    "(.ci/llama_vocabs.sh)")
    ap.add_argument("--compare", action="store_true", help="also print speczoo's agreement with llama.cpp")
    args = ap.parse_args(argv)
    with open(SAMPLE, encoding="utf-8", newline="") as f:
        sample = f.read()
    stdlib = stdlib_texts(STDLIB_CHARS)
    record = json.loads(OUT.read_text()) if OUT.is_file() else {"models": {}}
    record["sample_sha256"] = hashlib.sha256(sample.encode()).hexdigest()
    record["stdlib_chars"] = STDLIB_CHARS
    record["stdlib_sha256"] = texts_digest(stdlib)
    for spec in args.models:
        name, path = spec.split("=", 1)
        ref = llama_reference(Path(path))
        if ref is None:
            raise SystemExit("llama-tokenize not found: set SPECZOO_LLAMA_BIN (bash benchmarks/build_llama.sh)")
        stdlib_ids = [ref.encode(t) for t in stdlib]
        record["models"][name] = {
            "gguf": Path(path).resolve().name, "gguf_sha256": sha256_file(Path(path)),
            "sample_ids": _ids_text(ref.encode(sample)),
            "stdlib_ids": sum(map(len, stdlib_ids)), "stdlib_digest": ids_digest(stdlib_ids)}
        print(f"{name}: {len(record['models'][name]['sample_ids'].split())} sample ids, "
              f"{record['models'][name]['stdlib_ids']} stdlib ids")
        if args.compare:
            ours = read_tokenizer(Path(path))
            print("  sample:", tokenizer_parity(ours, None, sample, reference=ref).summary())
            print("  stdlib:", tokenizer_parity(ours, None, stdlib, reference=ref).summary())
    if args.vocabs is not None:
        binary = llama_tool("llama-tokenize")
        if binary is None:
            raise SystemExit("llama-tokenize not found: set SPECZOO_LLAMA_BIN (bash benchmarks/build_llama.sh)")
        record_vocabs(record, args.vocabs, binary)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
