"""OpenAI-compatible servers beside the suite (`speczoo suite TARGET --endpoint URL[,SYSTEM:MODE]`): the same
questions and the same prompt text for every server, each server's speculation judged against its own greedy.

The prompt of turn t: TARGET's chat template renders the question's messages (speczoo.bench.suite.
render_turn) with the earlier turns' answers of ONE source, recorded in each row as `prompt_source`:
speczoo's local `off` where the suite ran it, else the first endpoint's own answers. That text is sent to
/v1/completions as the prompt (`prompt="ids"`: its ids, encoded by TARGET's tokenizer, instead). Text by
default: every OpenAI-compatible server takes a string prompt while some refuse token arrays, and the chat
endpoint would let each server render its own template; each row records the prompt_tokens its server
counted, so a server that tokenized the text differently (an extra BOS, say) shows in the report.

Rows have the shape of speczoo.bench.suite.make_row, under the endpoint's label as the method:
* ids: each turn's answer text encoded by TARGET's tokenizer (a server streams text, not ids; equal ids ⇔
  equal text, and first_mismatch counts these re-encoded tokens);
* tokens: the server's usage completion_tokens (the re-encoded count where it sent none: token_count
  "re-encoded"); seconds: first text → the finish chunk (the decode, as speczoo's decode seconds and
  llama-server's predicted_ms); prefill_seconds: request → first text; total_seconds: request → finish,
  and tok_s_total = tokens / total_seconds (prefill included);
* lossless: equal on every turn to its system's greedy endpoint (the first whose mode is greedy or off;
  a system without one is refused up front); equals_off: equal to speczoo's local off, where it ran.
One untimed 4-token answer warms each endpoint up before its first timed question.

This module never starts a server, never reruns a row already in results.jsonl, and never judges an
endpoint against another system's greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from speczoo.bench import report
from speczoo.bench.endpoint import Endpoint, EndpointClient
from speczoo.bench.peers_table import system_name
from speczoo.bench.questions import Question
from speczoo.bench.suite import (
    OFF, RESULTS, Conversation, SuiteSettings, append_row, check_settings, load_results, make_row,
    prompt_sha256, render_turn)
from speczoo.errors import SpeczooError

PROMPTS = ("text", "ids")
WARMUP_TOKENS = 4


def references(endpoints: list[Endpoint], taken: set[str] = frozenset()) -> dict[str, str]:
    """label → the label of its system's greedy endpoint. Labels must be unique and not name a local
    method (`taken`); every system needs a greedy endpoint."""
    refs: dict[str, str] = {}
    for ep in endpoints:
        if ep.label in refs or ep.label in taken:
            raise ValueError(f"--endpoint label {ep.label} is used twice (labels name rows; give each its own)")
        greedy = next((g for g in endpoints if g.system == ep.system and g.greedy), None)
        if greedy is None:
            raise ValueError(f"--endpoint {ep.label}: its system {ep.system} has no greedy endpoint to be judged "
                             f"against; add one labelled {ep.system}:greedy (the same server with speculation off)")
        refs[ep.label] = greedy.label
    return refs


@dataclass
class EndpointTurns:
    """What a row needs beyond the suite's Conversation."""

    total_seconds: float = 0.0
    prompt_tokens: list[int | None] = field(default_factory=list)
    token_count: str = "usage"        # "re-encoded" where a turn's usage was missing


def converse_endpoint(client: EndpointClient, tokenizer, question: Question, earlier: list[str] | None,
                      max_new_tokens: int, prompt: str = "text") -> tuple[Conversation, EndpointTurns]:
    """Every turn of `question` through the endpoint; turn t's earlier answers are earlier[:t] (None: its own)."""
    conv, extra = Conversation(), EndpointTurns()
    for t in range(len(question.turns)):
        text = render_turn(tokenizer, question, (earlier if earlier is not None else conv.texts)[:t])
        a = client.complete(text if prompt == "text" else tokenizer.encode(text), max_new_tokens)
        ids = tokenizer.encode(a.text)
        if a.completion_tokens is None:
            extra.token_count = "re-encoded"
        conv.texts.append(a.text)
        conv.ids.append(ids)
        conv.tokens += a.completion_tokens if a.completion_tokens is not None else len(ids)
        conv.seconds += a.decode_seconds
        conv.prefill_seconds += a.first_seconds
        conv.drafted += int(a.usage.get("draft_tokens") or 0)          # speczoo serve's usage extension
        conv.accepted += int(a.usage.get("accepted_draft_tokens") or 0)
        conv.rounds += int(a.usage.get("rounds") or 0)
        conv.finish.append(a.finish)
        extra.total_seconds += a.total_seconds
        extra.prompt_tokens.append(a.prompt_tokens)
    return conv, extra


def run_endpoints(tokenizer, questions: list[Question], settings: SuiteSettings, target: str,
                  endpoints: list[Endpoint], out_dir: Path, prompt: str = "text", log=print) -> list[dict]:
    """Run (or resume) every endpoint on every question into out_dir/results.jsonl, in the given order;
    returns the endpoint rows of this selection, old and new."""
    if prompt not in PROMPTS:
        raise ValueError(f"--endpoint-prompt must be one of {', '.join(PROMPTS)}, got {prompt!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / RESULTS
    existing = load_results(results)
    others = [r for r in existing if "endpoint" not in r]         # speczoo's and llama-server's rows
    refs = references(endpoints, taken={r["method"] for r in others} | {system_name(r) for r in others})
    check_settings(existing, {"target": target, "backend": settings.backend, "max_new_tokens": settings.max_new_tokens,
                              "k": settings.k, "ngram": settings.ngram}, results)
    done = {(r["question_id"], r["method"]): r for r in existing}
    first = endpoints[0].label

    def source(q: Question) -> tuple[str, list[str] | None]:
        """Whose earlier answers turn t's prompt carries: (its name, their texts; None: the endpoint's own)."""
        if (q.question_id, OFF) in done:
            return OFF, done[(q.question_id, OFF)]["texts"]
        row = done.get((q.question_id, first))
        return first, row["texts"] if row else None

    for q in questions:
        for ep in endpoints:
            row = done.get((q.question_id, ep.label))
            if row is not None and (row.get("prompt_sha256") != prompt_sha256(q) or row.get("prompt_source") != source(q)[0]
                                    or row.get("prompt_kind") != prompt):
                raise SpeczooError(f"{results} has a row of {ep.label} for question {q.question_id} made with other "
                                   "prompts (turns, the source of earlier answers, or text vs ids); use a fresh --out")
    for ep in endpoints:
        todo = [q for q in questions if (q.question_id, ep.label) not in done]
        if not todo:
            continue
        client = EndpointClient(ep)
        log(f"endpoint {ep.label} ({ep.base_url}, model {client.model}): {len(todo)} question(s)")
        warm = render_turn(tokenizer, todo[0], [])
        client.complete(warm if prompt == "text" else tokenizer.encode(warm), WARMUP_TOKENS)
        for q in todo:
            name, earlier = source(q)
            conv, extra = converse_endpoint(client, tokenizer, q, earlier, settings.max_new_tokens, prompt)
            ref = refs[ep.label]
            reference = conv.ids if ref == ep.label else done[(q.question_id, ref)]["ids"]
            row = make_row(q, ep.label, conv, settings, target, reference)
            off = done.get((q.question_id, OFF))
            row.update(system=ep.system, endpoint=ep.base_url, model=client.model, request=ep.body, reference=ref,
                       equals_off=None if off is None else conv.texts == off["texts"],
                       prompt_source=name, prompt_kind=prompt, prompt_tokens=extra.prompt_tokens,
                       token_count=extra.token_count, total_seconds=extra.total_seconds,
                       tok_s_total=report.tok_s(conv.tokens, extra.total_seconds))
            append_row(results, row)
            done[(q.question_id, ep.label)] = row
    return [done[(q.question_id, ep.label)] for ep in endpoints for q in questions]


def render_streamed(rows: list[dict]) -> str:
    """A markdown table of the endpoints, overall: decode tok/s, tok/s with the prefill, time to first
    text, whether every server counted the same prompt tokens, equality with their greedy and with off."""
    labels = list(dict.fromkeys(r["method"] for r in rows if "endpoint" in r))
    if not labels:
        return ""
    counts = {}
    for r in rows:
        if "endpoint" in r:
            counts.setdefault((r["question_id"], r.get("prompt_source")), set()).add(tuple(r["prompt_tokens"]))
    same = all(len(c) == 1 for c in counts.values())
    lines = ["", "## Servers by URL (streamed)", "",
             "Timed from the stream: decode = first text → finish chunk; with prefill = request → finish chunk. "
             "Prompt tokens as each server counted them are " + ("the same on every server." if same else
             "NOT the same on every server: their tokenizers read the prompt text differently (see prompt_tokens "
             "in results.jsonl)."), "",
             "| endpoint | model | questions | tokens | tok/s (decode) | tok/s (with prefill) | first text, mean s | "
             "equals its greedy | equals off |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label in labels:
        rs = [r for r in rows if r["method"] == label]
        tokens, seconds = sum(r["tokens"] for r in rs), sum(r["seconds"] for r in rs)
        total, first = sum(r["total_seconds"] for r in rs), sum(r["prefill_seconds"] for r in rs)
        turns = sum(r["turns"] for r in rs)
        judged = [r["equals_off"] for r in rs if r.get("equals_off") is not None]
        mine = "reference" if rs[0]["reference"] == label else f"{sum(r['lossless'] for r in rs)}/{len(rs)}"
        lines.append(f"| {label} | {rs[0]['model']} | {len(rs)} | {tokens} | {report.tok_s(tokens, seconds):.2f} | "
                     f"{report.tok_s(tokens, total):.2f} | {first / max(1, turns):.2f} | {mine} | "
                     f"{f'{sum(judged)}/{len(judged)}' if judged else '—'} |")
    return "\n".join(lines) + "\n"
