"""How often prompt lookup's first draft token is accepted, per n-gram situation, on real greedy outputs.

    python -m benchmarks.ngram_situations [docs/suite/results.jsonl] [--k 8] [--tree]

Reads a suite's results (the `off` rows: the target's own greedy answers, turn by turn) and replays
every answer through the n-gram index as the engine would see it: at each position the context is the
prompt plus the answer so far, the drafter names its situation (NgramIndex.situation: match length band
and whether the suffix's recent occurrences agree), and its lookup of K tokens is compared with what the
target really wrote next. Prints, per situation and per group of categories (echo: output copies the
input; prose: the rest), how many positions fell in it, P(first draft token accepted) and the mean
accepted run. Drafting.situation_priors (decoding/tuning.py) come from the "all" rows of this table. With
`--tree` the runs are prompt lookup's tree's (drafters/ngram_tree.py, K nodes): its accepted path against
the same answer. Model-free apart from the tokenizer; a measurement script, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from speczoo.bench.questions import builtin_questions, load_questions
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.round import RoundPlan, verify_recorded
from speczoo.decoding.types import Draft

ECHO = {"verbatim", "code_edit", "code_completion", "rag"}


def replay(prompt: list[int], answer: list[int], k: int, order: int = 3, tree: bool = False
           ) -> list[tuple[str, int]]:
    """(situation, accepted run of a K-token lookup, or of a K-node tree's accepted path) at every answer
    position that has a match, verified as the replays verify (decoding/round.py `verify_recorded`)."""
    drafter = NgramTreeDrafter(max_order=order)
    idx = drafter.index
    idx.extend(prompt)
    out = []
    for p in range(len(answer) - 1):
        idx.extend([answer[p]])              # the round's a0 is committed; the draft follows it
        sit = idx.situation()
        if sit is None:
            continue
        plan = (RoundPlan(drafter.name, drafter.propose(idx.tokens, k), chain=False) if tree
                else RoundPlan("ngram", Draft(tokens=idx.lookup(k))))
        out.append((sit, verify_recorded(plan, answer, p)[0].accepted))
    return out


def table(results: Path, questions: str | None, k: int, tree: bool = False) -> dict[tuple[str, str], list[int]]:
    """(group, situation) -> [positions, first accepted, accepted tokens]."""
    from speczoo.runtime import load

    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["method"] == "off"]
    if not rows:
        raise SystemExit(f"{results} has no 'off' rows: run the suite with the off method first")
    qs = {q.question_id: q for q in (load_questions(questions) if questions else builtin_questions())}
    tok = load(rows[0]["target"]).tokenizer
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for row in rows:
        q = qs[row["question_id"]]
        group = "echo" if row["category"] in ECHO else "prose"
        messages: list[dict] = []
        for turn, answer, text in zip(q.turns, row["ids"], row["texts"]):
            messages.append({"role": "user", "content": turn})
            prompt = tok.chat_ids(messages)
            messages.append({"role": "assistant", "content": text})
            for sit, run in replay(prompt, answer, k, tree=tree):
                for key in ((group, sit), ("all", sit)):
                    c = counts[key]
                    c[0] += 1
                    c[1] += run > 0
                    c[2] += run
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="?", default="docs/suite/results.jsonl", help="a suite's results.jsonl")
    ap.add_argument("--questions", default=None, help="the suite's questions file (default: the built-in set)")
    ap.add_argument("--k", type=int, default=8, help="draft length of the replayed lookups")
    ap.add_argument("--tree", action="store_true", help="the runs of prompt lookup's tree of K nodes instead")
    args = ap.parse_args(argv)
    counts = table(Path(args.results), args.questions, args.k, args.tree)
    print(f"{'group':6} {'situation':10} {'positions':>9} {'P(first)':>9} {'mean run':>9}")
    for (group, sit), (n, first, total) in sorted(counts.items()):
        print(f"{group:6} {sit:10} {n:9d} {first / n:9.2f} {total / n:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
