"""The offline replay's report (auto_replay.py): per category, each mode's speedup, and the verdict.

A category is the suite's (a recording named `{category}-{question_id}`; a built-in prompt is a category
of its own). Each mode's speed is its output tokens per modeled target step, against plain greedy's 1.0;
the verdict says whether `auto` holds AUTO_FLOOR × greedy in every category, and how far it is from the
best single mode. Arithmetic and printing over replay results; it never runs a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.auto_replay import Recording, Replay

AUTO_FLOOR = 0.97       # `auto` must keep at least this share of plain greedy's speed, in every category


def category_of(name: str) -> str:
    """A suite recording's category (`{category}-{question_id}`); a built-in prompt is its own."""
    head_, _, tail = name.rpartition("-")
    return head_ if head_ and tail.isdigit() else name


@dataclass
class Tally:
    """One category's recordings replayed: output tokens, and target steps spent per mode."""
    recordings: int = 0
    tokens: int = 0
    cost: dict[str, float] = field(default_factory=dict)
    lossless: bool = True

    def add(self, tokens: int, results: dict[str, Replay]) -> None:
        self.recordings += 1
        self.tokens += tokens
        for mode, r in results.items():
            self.cost[mode] = self.cost.get(mode, 0.0) + r.cost
            self.lossless &= r.lossless

    def speedup(self, mode: str) -> float:
        """Tokens per modeled target step against plain greedy's 1.0 (greedy spends a step per token)."""
        return self.tokens / self.cost[mode]

    def gap(self) -> float:
        """`auto` against the best single mode here: auto / best − 1."""
        return self.speedup("auto") / max(self.speedup(m) for m in self.cost if m != "auto") - 1.0


@dataclass
class Verdict:
    holds: bool             # `auto` ≥ AUTO_FLOOR × greedy in every category, and every replay lossless
    worst: str              # the category where `auto` is slowest against greedy
    worst_speedup: float
    mean_gap: float         # `auto` against the best single mode, mean over categories
    worst_gap: float
    worst_gap_category: str


def tally(recs: dict[str, Recording], results: dict[str, dict[str, Replay]]) -> dict[str, Tally]:
    """Per category, in the recordings' order."""
    out: dict[str, Tally] = {}
    for name, rec in recs.items():
        out.setdefault(category_of(name), Tally()).add(len(rec.out), results[name])
    return out


def verdict(cats: dict[str, Tally], floor: float = AUTO_FLOOR) -> Verdict:
    if not cats:
        raise ValueError("no recordings to judge")
    worst = min(cats, key=lambda c: cats[c].speedup("auto"))
    gaps = {c: t.gap() for c, t in cats.items()}
    worst_gap = min(gaps, key=gaps.__getitem__)
    ok = cats[worst].speedup("auto") >= floor and all(t.lossless for t in cats.values())
    return Verdict(ok, worst, cats[worst].speedup("auto"), sum(gaps.values()) / len(gaps), gaps[worst_gap],
                   worst_gap)


def print_report(recs: dict[str, Recording], results: dict[str, dict[str, Replay]], modes: Sequence[str],
                 each: bool = False) -> Verdict:
    """The per-category table (and, with `each`, one row per recording) and the verdict line."""
    cats = tally(recs, results)
    width = max(14, *(len(c) for c in cats), *(len(n) + 2 for n in recs if each))
    print(f"{'category':{width}s} {'tokens':>6s} " + " ".join(f"{m:>10s}" for m in modes)
          + "  auto vs best  lossless")
    for cat, t in cats.items():
        print(f"{cat:{width}s} {t.tokens:6d} " + " ".join(f"{t.speedup(m):9.2f}x" for m in modes)
              + f"  {t.gap():+6.1%}       {'yes' if t.lossless else 'NO'}")
        if each:
            for name, rec in recs.items():
                if category_of(name) == cat and name != cat:
                    _print_recording(name, rec, results[name], modes, width)
    v = verdict(cats)
    print(f"auto >= {AUTO_FLOOR:.2f}x greedy in every category: {'HOLDS' if v.holds else 'FAILS'} "
          f"(slowest: {v.worst} {v.worst_speedup:.2f}x); auto against the best single mode: mean "
          f"{v.mean_gap:+.1%}, worst {v.worst_gap:+.1%} ({v.worst_gap_category})", flush=True)
    return v


def _print_recording(name: str, rec: Recording, res: dict[str, Replay], modes: Sequence[str], width: int) -> None:
    gap = res["auto"].speedup / max(res[m].speedup for m in modes if m != "auto") - 1
    mix = " ".join(f"{d} {c}" for d, c in sorted(res["auto"].by_drafter.items()))
    print(f"  {name:{width - 2}s} {len(rec.out):6d} " + " ".join(f"{res[m].speedup:9.2f}x" for m in modes)
          + f"  {gap:+6.1%}       auto's rounds: {mix}")
