"""Which ids a reduced draft head should keep: the first N (merge order) or the N most frequent in a corpus.

    python -m benchmarks.vocab_coverage [MODEL] [--sizes 8192,16384,32768,49152]

FR-Spec and EAGLE-3 keep the draft vocabulary's most frequent ids, counted on a large corpus. No hub is
reachable here, so the corpus is what every install has: the Python standard library's own sources
(its .py files outside test folders, tokenized with MODEL's tokenizer), ties broken by merge order (a
lower id first). The reduced head (decoding/drafters/draft_head.py) keeps the first N ids instead:
byte-level BPE ids are in merge order, itself a frequency order on the tokenizer's (much larger)
training corpus. For each N this prints the share of the tokens of three held-out texts that each
choice keeps: speczoo's own sources (code), its docs (English about code) and the questions of
`speczoo suite` (prose). A measurement script, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stdlib_counts(tok) -> Counter:
    """How often each id occurs in the standard library's sources (test folders left out)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.rglob("*.py") if not {"site-packages", "test", "tests"} & set(p.parts))
    counts: Counter = Counter()
    for enc in tok.encode_batch([p.read_text(errors="replace") for p in files], add_special_tokens=False):
        counts.update(enc.ids)
    return counts


def frequent_first(counts: Counter, vocab: int) -> list[int]:
    """Every id, the most frequent first, ties (and ids never seen) in merge order."""
    return sorted(range(vocab), key=lambda i: (-counts.get(i, 0), i))


def held_out() -> dict[str, str]:
    questions = ROOT / "src/speczoo/bench/data/questions.jsonl"
    turns = [t for line in questions.read_text().splitlines() if line.strip() for t in json.loads(line)["turns"]]
    return {"speczoo sources (code)": "\n".join(p.read_text() for p in sorted((ROOT / "src/speczoo").rglob("*.py"))),
            "docs/*.md (English on code)": "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))),
            "suite questions (prose)": "\n".join(turns)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="qwen2.5-coder-0.5b", help="zoo model whose tokenizer to use")
    ap.add_argument("--sizes", default="8192,16384,32768,49152", help="numbers of kept ids")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    from tokenizers import Tokenizer

    from speczoo.tokenizer import TOKENIZER_FILE
    from speczoo.zoo.bundle import find_bundle

    tok = Tokenizer.from_file(str(find_bundle(args.model) / TOKENIZER_FILE))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    counts = stdlib_counts(tok)
    print(f"{args.model}: {vocab} ids; the standard library's sources: {sum(counts.values())} tokens, "
          f"{len(counts)} distinct ids")
    rank = frequent_first(counts, vocab)
    for name, text in held_out().items():
        ids = tok.encode(text, add_special_tokens=False).ids
        print(f"{name}: {len(ids)} tokens")
        for n in sizes:
            top = set(rank[:n])
            print(f"  N = {n:6d}: first N ids keep {sum(i < n for i in ids) / len(ids):6.1%}, the N most frequent in "
                  f"the stdlib {sum(i in top for i in ids) / len(ids):6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
