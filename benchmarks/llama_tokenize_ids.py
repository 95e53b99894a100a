"""Record llama.cpp's token ids for the real-model tokenizer tests: tests/data/llama_tokenize.json.

    SPECZOO_LLAMA_BIN=/path/to/llama.cpp/build/bin python -m benchmarks.llama_tokenize_ids \\
        smollm2=SmolLM2-135M-Instruct.Q4_1.gguf qwen2.5-coder-0.5b=... gemma-3-270m=...

For each GGUF (named as tests/real_ggufs.py names it): its sha256; llama.cpp's ids (`llama-tokenize`,
special tokens parsed, no BOS) for tests/data/tokenizer_sample.txt, in full; and for the first 30,000
characters of Python's standard library (`speczoo.zoo.tokparity.stdlib_texts(30_000)`, each text apart)
the number and the sha256 of the ids (`ids_digest`); the sample's and the texts' sha256 too. With
--compare it also prints speczoo's agreement. An entry for a GGUF not named is kept. llama-tokenize
comes from benchmarks/build_llama.sh.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from speczoo.zoo.gguf_tokenizer import read_tokenizer
from speczoo.zoo.source import sha256_file
from speczoo.zoo.tokparity import ids_digest, llama_reference, stdlib_texts, texts_digest, tokenizer_parity

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SAMPLE = DATA / "tokenizer_sample.txt"
OUT = DATA / "llama_tokenize.json"
STDLIB_CHARS = 30_000


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="NAME=PATH of each GGUF")
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
            "gguf": Path(path).name, "gguf_sha256": sha256_file(Path(path)),
            "sample_ids": " ".join(map(str, ref.encode(sample))),   # as llama.cpp's .out files write ids
            "stdlib_ids": sum(map(len, stdlib_ids)), "stdlib_digest": ids_digest(stdlib_ids)}
        print(f"{name}: {len(record['models'][name]['sample_ids'].split())} sample ids, "
              f"{record['models'][name]['stdlib_ids']} stdlib ids")
        if args.compare:
            ours = read_tokenizer(Path(path))
            print("  sample:", tokenizer_parity(ours, None, sample, reference=ref).summary())
            print("  stdlib:", tokenizer_parity(ours, None, stdlib, reference=ref).summary())
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
