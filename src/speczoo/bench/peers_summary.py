"""`speczoo peers`' summary: its rows per system, per category and overall, and the markdown report.

A system's speed against the baseline (llama.cpp greedy by default) pairs the two on the questions both
ran, per category; overall is the geometric mean over categories (speczoo.bench.report's rules). A row
is lossless when it equals its family's greedy reference. Pure functions over the rows peers.py
writes: this module never runs a system.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from speczoo.bench import report
from speczoo.bench.report import paired_groups

BASELINE = "llama:greedy"


@dataclass
class SystemSummary:
    system: str
    describe: str
    questions: int
    new_tokens: int
    tokens: int
    seconds: float
    ratio: float | None        # vs the baseline (paired); None without baseline rows to pair with
    lossless: int              # rows equal to their reference
    judged: int                # rows that had a reference to be judged against
    is_reference: bool
    timing: str

    @property
    def tok_s(self) -> float:
        return report.tok_s(self.tokens, self.seconds)


@dataclass
class PeersSummary:
    baseline: str
    categories: list[tuple[str, list[SystemSummary]]]
    overall: list[SystemSummary]

    def system(self, name: str, category: str | None = None) -> SystemSummary:
        group = self.overall if category is None else next(
            (s for c, s in self.categories if c == category), [])
        for s in group:
            if s.system == name:
                return s
        raise KeyError(f"no summary for {name!r} in {category or 'overall'!r}")


def summarize_system(system: str, rows: list[dict], base_rows: list[dict]) -> SystemSummary:
    timings = sorted({r["timing"] for r in rows})
    return SystemSummary(
        system=system, describe=rows[0].get("describe", ""), questions=len(rows),
        new_tokens=sum(r["new_tokens"] for r in rows), tokens=sum(r["tokens"] for r in rows),
        seconds=sum(r["seconds"] for r in rows),
        ratio=report.paired_speedup(rows, base_rows) if base_rows else None,
        lossless=sum(1 for r in rows if r.get("lossless") is True),
        judged=sum(1 for r in rows if r.get("lossless") is not None),
        is_reference=rows[0].get("reference") is None, timing="+".join(timings))


def summarize(rows: list[dict], categories: list[str] | None = None, baseline: str = BASELINE
              ) -> PeersSummary:
    """Per category and overall, every system in the order rows first show it."""
    systems = list(dict.fromkeys(r["system"] for r in rows))
    cats = [(cat, [summarize_system(s, rs, base) for s, rs, base in group])
            for cat, group in paired_groups(rows, categories, "system", systems, baseline)]
    overall = []
    all_base = [r for r in rows if r["system"] == baseline]
    for s in systems:
        summary = summarize_system(s, [r for r in rows if r["system"] == s], all_base)
        per_cat = [x.ratio for _, group in cats for x in group if x.system == s and x.ratio]
        summary.ratio = report.geomean(per_cat) if per_cat else None
        overall.append(summary)
    return PeersSummary(baseline=baseline, categories=cats, overall=overall)


def _fmt_ratio(r: float | None) -> str:
    return "—" if r is None or math.isnan(r) else f"{r:.2f}x"


def _fmt_lossless(s: SystemSummary) -> str:
    if s.is_reference:
        return "reference"
    return f"{s.lossless}/{s.judged}" if s.judged else "— (reference not run)"


def _table(group: list[SystemSummary], baseline: str) -> list[str]:
    lines = [f"| system | what | questions | new tokens | tok/s | vs {baseline} | lossless | timing |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for s in group:
        lines.append(f"| {s.system} | {s.describe} | {s.questions} | {s.new_tokens} | {s.tok_s:.2f} | "
                     f"{_fmt_ratio(s.ratio)} | {_fmt_lossless(s)} | {s.timing} |")
    return lines


def render_markdown(summary: PeersSummary, title: str, notes: list[str]) -> str:
    out = [f"# {title}", ""] + [f"- {n}" for n in notes]
    out += ["", f"## Overall (ratio = geometric mean over categories of tok/s vs {summary.baseline})", ""]
    out += _table(summary.overall, summary.baseline)
    for cat, group in summary.categories:
        out += ["", f"## {cat}", ""] + _table(group, summary.baseline)
    out += ["", "tok/s = timed tokens / timed seconds, where the timed tokens are the decode steps after the "
            "prefill's first token (new tokens − 1, + 1 when the answer ended at EOS). timing: first-token = "
            "seconds from the first new token to the last; engine = speczoo's own decode seconds; "
            "total-minus-prefill = the whole generate call minus the prefill time HF greedy took on the same "
            "prompt (total = the whole call, when noise made that difference implausibly small); "
            "reported = llama-server's own timing of its answer (predicted_ms). lossless x/y: x answers whose "
            "token ids equal the system's own greedy's (llama:greedy for llama-server's modes), of y judged.", ""]
    return "\n".join(out)
