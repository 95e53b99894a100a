"""The one table of every system side by side, from a suite's rows: speczoo's methods, llama-server's modes
(`--llama-server`) and servers by URL (`--endpoint`), per category and overall.

Each row of the table: tok/s (Σ tokens / Σ decode seconds), the speedup over the baseline (llama.cpp's
greedy, `llama:greedy`, by default), paired on the questions both ran in the category, overall the
geometric mean over categories (speczoo.bench.report's rules), and whether the answers equal that
system's OWN greedy (speczoo's methods: `off`; llama-server's modes: `llama:greedy`; an endpoint: its
system's greedy endpoint). A system's decode seconds are taken where it can be timed (`timing`): engine
= speczoo's own, server = llama-server's predicted_ms, stream = the streamed answer, first text → finish.

This module never runs a system or reads a file: pure functions over the rows.
"""

from __future__ import annotations

import math

from speczoo.bench import report

BASELINE = "llama:greedy"
FILE = "peers.md"


def system_name(row: dict) -> str:
    """speczoo's local methods get a `speczoo:` prefix; llama-server's and the endpoints' carry their own."""
    return row["method"] if "system" in row else f"speczoo:{row['method']}"


def timing(row: dict) -> str:
    if "endpoint" in row:
        return "stream"
    return "server" if "system" in row else "engine"


def equality(rows: list[dict]) -> str:
    if rows[0].get("reference", report.OFF) == rows[0]["method"]:
        return "reference"
    return f"{sum(1 for r in rows if r.get('lossless'))}/{len(rows)}"


def _ratio(r: float | None) -> str:
    return "—" if r is None or math.isnan(r) else f"{r:.2f}x"


def render(rows: list[dict], categories: list[str] | None = None, baseline: str = BASELINE,
           notes: list[str] | None = None) -> str:
    """The markdown of the table (see the module doc); `baseline` is a system name as the table shows it."""
    named = [{**r, "system_name": system_name(r)} for r in rows]
    systems = list(dict.fromkeys(r["system_name"] for r in named))
    groups = report.paired_groups(named, categories, "system_name", systems, baseline)
    out = ["# Every system side by side", ""] + [f"- {n}" for n in notes or []]
    if baseline not in systems:
        out.append(f"- the baseline {baseline} did not run, so the speedup column is empty")
    out += ["", f"| category | system | questions | tok/s | vs {baseline} | equals its greedy | timing |",
            "|---|---|---:|---:|---:|---:|---|"]
    per_system: dict[str, list[float]] = {}
    for cat, group in groups:
        for name, rs, base in group:
            ratio = report.paired_speedup(rs, base) if base else None
            if ratio:
                per_system.setdefault(name, []).append(ratio)
            tok_s = report.tok_s(sum(r["tokens"] for r in rs), sum(r["seconds"] for r in rs))
            out.append(f"| {cat} | {name} | {len(rs)} | {tok_s:.2f} | {_ratio(ratio)} | {equality(rs)} | "
                       f"{timing(rs[0])} |")
    for name in systems:
        rs = [r for r in named if r["system_name"] == name]
        tok_s = report.tok_s(sum(r["tokens"] for r in rs), sum(r["seconds"] for r in rs))
        ratio = report.geomean(per_system[name]) if name in per_system else None
        out.append(f"| **overall** | {name} | {len(rs)} | {tok_s:.2f} | **{_ratio(ratio)}** | {equality(rs)} | "
                   f"{timing(rs[0])} |")
    out += ["", "tok/s = Σ tokens / Σ decode seconds (prefill excluded); speedup pairs a system with the baseline on "
            "the questions both ran in the category, overall = geometric mean over categories; equals its greedy "
            "x/y: answers equal on every turn to the system's own greedy (speczoo: off; llama-server: llama:greedy; "
            "a server by URL: its system's greedy endpoint). timing: engine = speczoo's decode seconds, server = "
            "llama-server's predicted_ms, stream = first streamed text to the finish chunk.", ""]
    return "\n".join(out)
