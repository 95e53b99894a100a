"""llama.cpp's `llama-server` beside the suite: the same questions, the same prompt ids, one server per mode.

Modes: `greedy` (plain), `ngram-mod` (`--spec-type ngram-mod`, llama.cpp's n-gram drafter that remembers
across requests, at its default sizes) and `draft` (`--spec-type draft-simple -md DRAFT.gguf
--spec-draft-n-max K`, the target's zoo draft model). Each mode gets a fresh server on loopback on the
SAME GGUF the speczoo bundle was built from, one slot, the same thread count, temperature 0, its prompt
cache on as it comes (an agent's server keeps it); one untimed warm-up answer, then every question's
turns in order through `/completion` with the prompt as token ids: for turn t the ids speczoo's `off`
row was fed (its own earlier answers as the assistant turns), so both systems see the same ids.

Rows have the suite's shape (speczoo.bench.suite.make_row) under the method `llama:MODE`, so the suite's
report pairs them with `off` like any method. Their seconds are llama-server's own `timings`
(predicted_ms: the generation after the prompt, as speczoo's decode seconds), their tokens the answer's
ids (its end-of-generation token cut, as speczoo's answers have none); drafted/accepted are its draft_n/draft_n_accepted (it reports no rounds). `lossless` of a
mode is judged against `llama:greedy`'s ids (llama.cpp's reference, not speczoo's); `equals_off` says
whether the answer's ids equal speczoo's greedy ones.

This module never builds llama.cpp, never binds beyond 127.0.0.1 (serve_load_llama.LlamaServer), and
never runs a question whose speczoo `off` row is missing (the prompts come from it).
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from pathlib import Path

from speczoo.bench import report
from speczoo.bench.questions import Question
from speczoo.bench.serve_load_llama import LlamaServer
from speczoo.bench.suite import (
    OFF, RESULTS, Conversation, SuiteSettings, append_row, load_results, make_row, turn_ids)
from speczoo.errors import SpeczooError

PREFIX = "llama:"
MODES = ("greedy", "ngram-mod", "draft")
REFERENCE = PREFIX + "greedy"
TIMEOUT = 1800.0                 # seconds one answer may take on a loaded machine


@dataclass
class LlamaSuiteSettings:
    binary: str
    gguf: Path
    threads: int
    modes: list[str]
    draft_gguf: Path | None = None


def parse_modes(spec: str, has_draft: bool) -> list[str]:
    """ "greedy,ngram-mod,draft" → the modes, greedy first (the reference of the others, required)."""
    modes = list(dict.fromkeys(m.strip() for m in spec.split(",") if m.strip()))
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown llama-server mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    if "greedy" not in modes:
        raise ValueError("--llama-modes must include greedy (the reference of llama-server's other modes)")
    if "draft" in modes and not has_draft:
        raise ValueError("the llama-server draft mode needs a draft model: the target has no zoo draft, so "
                         "pass --draft NAME or leave draft out of --llama-modes")
    return ["greedy"] + [m for m in modes if m != "greedy"]


def mode_args(mode: str, s: LlamaSuiteSettings, k: int) -> list[str]:
    """llama-server's flags for a mode (besides the ones every start has: serve_load_llama.LlamaServer)."""
    if mode == "greedy":
        return []
    if mode == "ngram-mod":
        return ["--spec-type", "ngram-mod"]
    if mode == "draft":
        t = str(s.threads)
        return ["--spec-type", "draft-simple", "-md", str(s.draft_gguf), "--spec-draft-n-max", str(k),
                "-td", t, "-tbd", t]
    raise ValueError(f"unknown llama-server mode {mode!r}")


def completion_body(ids: list[int], max_new_tokens: int) -> dict:
    """A greedy /completion request on token ids: top-k 1, no penalties, the ids of the answer back."""
    return {"prompt": ids, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1, "top_p": 1.0,
            "min_p": 0.0, "repeat_penalty": 1.0, "seed": 0, "cache_prompt": True, "return_tokens": True,
            "stream": False}


def post_completion(host: str, port: int, body: dict) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read().decode("utf-8", errors="replace")
    finally:
        conn.close()
    if resp.status != 200:
        raise SpeczooError(f"llama-server answered /completion with HTTP {resp.status}: {raw[:300]}")
    return json.loads(raw)


def add_answer(conv: Conversation, answer: dict, eos_ids: list[int]) -> None:
    """One /completion answer into the conversation's totals (llama-server's own timings). Its ids end
    with the end-of-generation token where it stopped at one; speczoo's answers do not, so it is cut, and
    not counted as a token (its step stays in the seconds, as in speczoo's)."""
    timings = answer["timings"]
    ids = [int(t) for t in answer["tokens"]]
    if answer.get("stop_type") == "eos" and ids and ids[-1] in eos_ids:
        ids.pop()
    conv.texts.append(answer["content"])
    conv.ids.append(ids)
    conv.tokens += len(ids)
    conv.seconds += float(timings["predicted_ms"]) / 1000
    conv.prefill_seconds += float(timings["prompt_ms"]) / 1000
    conv.drafted += int(timings.get("draft_n", 0))
    conv.accepted += int(timings.get("draft_n_accepted", 0))
    conv.finish.append("stop" if answer.get("stop_type") in ("eos", "word") else "length")


def converse_llama(host: str, port: int, tokenizer, question: Question, off_texts: list[str],
                   max_new_tokens: int) -> Conversation:
    """Every turn of `question` through llama-server, fed the ids speczoo's `off` was fed."""
    conv = Conversation()
    for t in range(len(question.turns)):
        ids = turn_ids(tokenizer, question, off_texts[:t])
        add_answer(conv, post_completion(host, port, completion_body(ids, max_new_tokens)), tokenizer.eos_ids)
    return conv


def context_size(tokenizer, questions: list[Question], off_rows: dict[int, dict], max_new_tokens: int,
                 k: int) -> int:
    """The slot's context: the longest turn prompt + the answer + a draft's overrun + margin."""
    longest = max(len(turn_ids(tokenizer, q, off_rows[q.question_id]["texts"][:t]))
                  for q in questions for t in range(len(q.turns)))
    return longest + max_new_tokens + k + 64


def run_llama_modes(tokenizer, questions: list[Question], settings: SuiteSettings, target: str,
                    llama: LlamaSuiteSettings, out_dir: Path, log=print) -> list[dict]:
    """Run (or resume) every llama-server mode on every question into out_dir/results.jsonl, after the
    suite's `off` rows; returns the llama rows of this selection, old and new."""
    results = out_dir / RESULTS
    done = {(r["question_id"], r["method"]): r for r in load_results(results)}
    missing = [q.question_id for q in questions if (q.question_id, OFF) not in done]
    if missing:
        raise SpeczooError(f"llama-server's prompts come from speczoo's off answers, and {results} has none for "
                           f"question(s) {missing[:5]}: run the suite with off first")
    off_rows = {q.question_id: done[(q.question_id, OFF)] for q in questions}
    n_ctx = context_size(tokenizer, questions, off_rows, settings.max_new_tokens, settings.k)
    for mode in llama.modes:
        method = PREFIX + mode
        todo = [q for q in questions if (q.question_id, method) not in done]
        if not todo:
            continue
        log(f"llama-server {mode}: {len(todo)} question(s), context {n_ctx}")
        with LlamaServer(llama.binary, llama.gguf, parallel=1, slot_ctx=n_ctx, threads=llama.threads,
                         alias=target, extra_args=tuple(mode_args(mode, llama, settings.k))) as server:
            post_completion(server.host, server.port, completion_body(turn_ids(tokenizer, todo[0], []), 4))
            for q in todo:
                conv = converse_llama(server.host, server.port, tokenizer, q, off_rows[q.question_id]["texts"],
                                      settings.max_new_tokens)
                reference = conv.ids if mode == "greedy" else done[(q.question_id, REFERENCE)]["ids"]
                row = make_row(q, method, conv, settings, target, reference)
                row.update(system="llama-server", reference=REFERENCE,
                           equals_off=conv.ids == off_rows[q.question_id]["ids"], server_args=mode_args(
                               mode, llama, settings.k))
                append_row(results, row)
                done[(q.question_id, method)] = row
    return [done[(q.question_id, PREFIX + m)] for m in llama.modes for q in questions]


def render_versus(summary: report.Summary, rows: list[dict]) -> str:
    """A markdown table: every system's tok/s, its speedup vs speczoo's greedy (`off`) and vs
    llama-server's best mode (both geometric means over categories, report's rules), lossless."""
    llama = [m for m in summary.overall if m.method.startswith(PREFIX) and m.speedup]
    best = max(llama, key=lambda m: m.speedup, default=None)
    equal_off = sum(1 for r in rows if r["method"] == REFERENCE and r.get("equals_off"))
    n_ref = sum(1 for r in rows if r["method"] == REFERENCE)
    lines = ["", "## Against llama-server", "",
             f"llama-server's best mode: {best.method if best else '—'}; its greedy answers equal speczoo's "
             f"greedy on {equal_off}/{n_ref} questions (llama.cpp's arithmetic differs, so its modes are "
             "judged lossless against its own greedy).", "",
             "| system | tok/s | vs speczoo greedy | vs llama-server best | lossless |",
             "|---|---:|---:|---:|---:|"]
    for m in summary.overall:
        vs_best = (f"{m.speedup / best.speedup:.2f}x" if best and m.speedup else "—")
        vs_off = f"{m.speedup:.2f}x" if m.speedup else "—"
        lossless = ("reference" if m.method in (OFF, REFERENCE) else f"{m.lossless}/{m.questions}"
                    + (" (vs llama greedy)" if m.method.startswith(PREFIX) else ""))
        lines.append(f"| {m.method} | {m.tok_s:.2f} | {vs_off} | {vs_best} | {lossless} |")
    return "\n".join(lines) + "\n"
