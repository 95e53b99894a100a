"""The arithmetic and the text of a suite's summary: pure functions over result rows.

A result row (one per question and method, see speczoo.bench.suite) carries at least: question_id,
category, method, tokens, seconds, rounds, accepted, pos_drafted, pos_accepted, lossless.

Definitions (every figure in summary.md comes from these):
* tok/s of a group of rows   = Σ tokens / Σ seconds (decode seconds, prefill excluded).
* speedup of a method in a category = its tok/s / off's tok/s, both over the questions of that
  category that have a row for the method AND for off (paired); off's own speedup is 1. (A summary
  may name another base than off, e.g. a server's greedy where the suite ran no local method.)
* overall tok/s = Σ tokens / Σ seconds over every row of the method; overall speedup = the geometric
  mean of the per-category speedups (each category counts once, however many questions it has).
* accepted per round = Σ accepted / Σ rounds; acceptance at draft position j = Σ rounds whose
  position j was accepted / Σ rounds that drafted a position j.
* lossless x/y: x rows whose output ids equal their reference's for that question (all turns), of y
  rows: off's for speczoo's methods, their own greedy's for llama-server's modes and servers by URL.

This module must never run a model, read files or time anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

OFF = "off"


@dataclass
class MethodSummary:
    method: str
    questions: int
    tokens: int
    seconds: float
    rounds: int
    accepted: int
    lossless: int                     # rows whose output equals off's
    speedup: float | None             # vs off (paired questions); None without any off row to pair
    acceptance_by_position: list[float] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return tok_s(self.tokens, self.seconds)

    @property
    def accepted_per_round(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0


@dataclass
class CategorySummary:
    category: str
    methods: list[MethodSummary]


@dataclass
class Summary:
    categories: list[CategorySummary]
    overall: list[MethodSummary]
    base: str = OFF                   # the method every speedup is taken against

    def method(self, name: str, category: str | None = None) -> MethodSummary:
        """The summary of one method overall (category None) or in one category."""
        group = self.overall if category is None else next(
            (c.methods for c in self.categories if c.category == category), [])
        for m in group:
            if m.method == name:
                return m
        raise KeyError(f"no summary for method {name!r} in category {category or 'overall'!r}")


def tok_s(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def geomean(values: list[float]) -> float:
    """Geometric mean of positive values (nan for an empty list or any value <= 0)."""
    if not values or any(v <= 0 for v in values):
        return math.nan
    return math.exp(sum(math.log(v) for v in values) / len(values))


def acceptance_by_position(rows: list[dict]) -> list[float]:
    """Pooled acceptance rate at each draft position over rows (lists of unequal length padded)."""
    width = max((len(r.get("pos_drafted") or []) for r in rows), default=0)
    drafted, accepted = [0] * width, [0] * width
    for r in rows:
        for j, (d, a) in enumerate(zip(r.get("pos_drafted") or [], r.get("pos_accepted") or [])):
            drafted[j] += d
            accepted[j] += a
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted)]


def paired_speedup(rows: list[dict], off_rows: list[dict]) -> float | None:
    """tok/s(rows) / tok/s(off_rows) over the question ids both have; None when none are shared."""
    off_by_q = {r["question_id"]: r for r in off_rows}
    pairs = [(r, off_by_q[r["question_id"]]) for r in rows if r["question_id"] in off_by_q]
    if not pairs:
        return None
    base = tok_s(sum(o["tokens"] for _, o in pairs), sum(o["seconds"] for _, o in pairs))
    mine = tok_s(sum(r["tokens"] for r, _ in pairs), sum(r["seconds"] for r, _ in pairs))
    return mine / base if base > 0 else None


def summarize_method(method: str, rows: list[dict], off_rows: list[dict]) -> MethodSummary:
    return MethodSummary(
        method=method, questions=len(rows),
        tokens=sum(r["tokens"] for r in rows), seconds=sum(r["seconds"] for r in rows),
        rounds=sum(r["rounds"] for r in rows), accepted=sum(r["accepted"] for r in rows),
        lossless=sum(1 for r in rows if r.get("lossless")),
        speedup=paired_speedup(rows, off_rows),
        acceptance_by_position=acceptance_by_position(rows))


def ordered_methods(rows: list[dict], base: str = OFF) -> list[str]:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    return ([base] if base in methods else []) + [m for m in methods if m != base]


def paired_groups(rows: list[dict], categories: list[str] | None, key: str, names: list[str], base: str
                  ) -> list[tuple[str, list[tuple[str, list[dict], list[dict]]]]]:
    """Rows per category (in the given order, else first seen; a category without rows is left out),
    and in each, per value of `key` in `names`' order (those with rows there): (name, its rows, the
    category's rows of `base`, which its speed is paired against)."""
    if categories is None:
        categories = list(dict.fromkeys(r["category"] for r in rows))
    out = []
    for cat in categories:
        in_cat = [r for r in rows if r["category"] == cat]
        if not in_cat:
            continue
        base_rows = [r for r in in_cat if r[key] == base]
        out.append((cat, [(n, [r for r in in_cat if r[key] == n], base_rows)
                          for n in names if any(r[key] == n for r in in_cat)]))
    return out


def summarize(rows: list[dict], categories: list[str] | None = None, base: str = OFF) -> Summary:
    """Per category (in the given order, else first seen) and overall, for every method in rows, with
    speedups against `base` (off unless named)."""
    methods = ordered_methods(rows, base)
    cats = [CategorySummary(cat, [summarize_method(m, rs, off_rows) for m, rs, off_rows in group])
            for cat, group in paired_groups(rows, categories, "method", methods, base)]
    overall = []
    all_off = [r for r in rows if r["method"] == base]
    for m in methods:
        ms = summarize_method(m, [r for r in rows if r["method"] == m], all_off)
        per_cat = [s.speedup for c in cats for s in c.methods if s.method == m and s.speedup]
        ms.speedup = geomean(per_cat) if per_cat else None
        overall.append(ms)
    return Summary(categories=cats, overall=overall, base=base)


def _fmt_speedup(s: float | None) -> str:
    return "—" if s is None or math.isnan(s) else f"{s:.2f}x"


def _fmt_lossless(m: MethodSummary, base: str) -> str:
    return "reference" if m.method == base else f"{m.lossless}/{m.questions}"


def _method_table(groups: list[tuple[str, list[MethodSummary]]], base: str) -> list[str]:
    lines = [f"| category | method | questions | tokens | tok/s | speedup vs {base} | accepted/round | lossless |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for label, methods in groups:
        for m in methods:
            lines.append(f"| {label} | {m.method} | {m.questions} | {m.tokens} | {m.tok_s:.2f} | "
                         f"{_fmt_speedup(m.speedup)} | {m.accepted_per_round:.2f} | {_fmt_lossless(m, base)} |")
    return lines


def render_markdown(summary: Summary, title: str = "speczoo suite", notes: list[str] | None = None
                    ) -> str:
    """summary.md: a speedup grid (category × method), the full table, acceptance by position."""
    methods = [m.method for m in summary.overall]
    out = [f"# {title}", ""]
    out += [f"- {n}" for n in notes or []]
    base = summary.base
    out += ["", f"## Speedup vs {base} (tok/s ratio; overall = geometric mean over categories)", "",
            "| category | " + " | ".join(methods) + " |",
            "|---|" + "---:|" * len(methods)]
    for c in summary.categories:
        by = {m.method: m for m in c.methods}
        out.append(f"| {c.category} | " + " | ".join(
            _fmt_speedup(by[m].speedup) if m in by else "—" for m in methods) + " |")
    out.append("| **overall** | " + " | ".join(f"**{_fmt_speedup(m.speedup)}**" for m in summary.overall)
               + " |")
    out += ["", "## Per category and method", ""]
    out += _method_table([(c.category, c.methods) for c in summary.categories]
                         + [("**overall**", summary.overall)], base)
    out += ["", "## Acceptance by draft position (overall)", ""]
    for m in summary.overall:
        if m.method == base or not m.acceptance_by_position:
            continue
        rates = " ".join(f"{r:.2f}" for r in m.acceptance_by_position)
        out.append(f"- {m.method}: {rates}")
    out += ["", "tok/s = Σ tokens / Σ decode seconds (prefill excluded); speedup pairs each method with "
            f"{base} on the same questions; accepted/round = Σ accepted / Σ rounds; lossless counts outputs "
            "whose token ids equal their reference's on every turn (off's for speczoo's methods, their own "
            "greedy's for llama-server's modes and servers by URL).", ""]
    return "\n".join(out)
