"""llama.cpp's `llama-server` beside the suite: the same questions, the same prompt ids, one server per mode.

Modes (speczoo.bench.llama_modes: their flags, and the draft length llama.cpp's recipe gives): `greedy`,
`ngram-mod`, `ngram-simple` and `draft` (the target's zoo draft model). Each mode gets a fresh server on loopback on the
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

from dataclasses import dataclass
from pathlib import Path

from speczoo.bench import report
from speczoo.bench.llama_completion import LlamaAnswer, completion_body, post_completion
from speczoo.bench.llama_modes import DRAFT_N_MAX, NGRAM_N_MAX, mode_args
from speczoo.bench.questions import Question
from speczoo.bench.serve_load_llama import LlamaServer
from speczoo.bench.suite import (
    OFF, RESULTS, Conversation, SuiteSettings, append_row, load_results, make_row, turn_ids)
from speczoo.errors import SpeczooError

PREFIX = "llama:"
REFERENCE = PREFIX + "greedy"


@dataclass
class LlamaSuiteSettings:
    binary: str
    gguf: Path
    threads: int
    modes: list[str]
    draft_gguf: Path | None = None
    draft_max: int = DRAFT_N_MAX       # --spec-draft-n-max of the draft mode

    def args(self, mode: str) -> list[str]:
        """The flags of one mode's server."""
        return mode_args(mode, self.threads, self.draft_gguf, self.draft_max)


def add_answer(conv: Conversation, answer: dict, eos_ids: list[int]) -> None:
    """One /completion answer into the conversation's totals (llama-server's own timings). Its ids end
    with the end-of-generation token where it stopped at one; speczoo's answers do not, so it is cut, and
    not counted as a token (its step stays in the seconds, as in speczoo's)."""
    a = LlamaAnswer.of(answer, eos_ids)
    conv.texts.append(a.text)
    conv.ids.append(a.ids)
    conv.tokens += len(a.ids)
    conv.seconds += a.predicted_seconds
    conv.prefill_seconds += a.prompt_seconds
    conv.drafted += a.drafted
    conv.accepted += a.accepted
    conv.finish.append(a.finish)


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
    """The slot's context: the longest turn prompt + the answer + the longest draft's overrun (K, or an
    n-gram mode's NGRAM_N_MAX) + margin."""
    longest = max(len(turn_ids(tokenizer, q, off_rows[q.question_id]["texts"][:t]))
                  for q in questions for t in range(len(q.turns)))
    return longest + max_new_tokens + max(k, NGRAM_N_MAX) + 64


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
                         alias=target, extra_args=tuple(llama.args(mode))) as server:
            post_completion(server.host, server.port, completion_body(turn_ids(tokenizer, todo[0], []), 4))
            for q in todo:
                conv = converse_llama(server.host, server.port, tokenizer, q, off_rows[q.question_id]["texts"],
                                      settings.max_new_tokens)
                reference = conv.ids if mode == "greedy" else done[(q.question_id, REFERENCE)]["ids"]
                row = make_row(q, method, conv, settings, target, reference)
                row.update(system="llama-server", reference=REFERENCE,
                           equals_off=conv.ids == off_rows[q.question_id]["ids"], server_args=llama.args(mode))
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
