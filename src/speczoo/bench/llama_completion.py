"""One greedy answer from llama-server's own `/completion` endpoint on token ids, with its own timings.

`completion_body(ids, n)` is the request (temperature 0, top-k 1, no penalties, the answer's ids asked
back, the prompt cache on as it comes); `post_completion` sends it; `LlamaAnswer.of(json, eos_ids)` reads
the answer: its ids with the end-of-generation token cut where it stopped at one (speczoo's answers carry
none), its text, and llama-server's `timings`: `predicted_ms` runs from the first new token (which the
prompt's last batch produced) to the last, so it times len(ids) − 1 decode steps, plus the EOS step where
it stopped there (speczoo.bench.peers.timed_tokens counts the same way).

This module never starts a server (serve_load_llama.LlamaServer does) and never judges an answer.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass

from speczoo.errors import SpeczooError

TIMEOUT = 1800.0                 # seconds one answer may take on a loaded machine


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


@dataclass
class LlamaAnswer:
    ids: list[int]               # the answer's ids, the end-of-generation token cut
    text: str
    finish: str                  # "stop" (end of generation or a stop word) or "length"
    predicted_seconds: float     # llama-server's predicted_ms: first new token → last
    prompt_seconds: float        # its prompt_ms
    drafted: int
    accepted: int

    @classmethod
    def of(cls, answer: dict, eos_ids: list[int]) -> "LlamaAnswer":
        timings = answer["timings"]
        ids = [int(t) for t in answer["tokens"]]
        if answer.get("stop_type") == "eos" and ids and ids[-1] in eos_ids:
            ids.pop()
        return cls(ids=ids, text=answer["content"],
                   finish="stop" if answer.get("stop_type") in ("eos", "word") else "length",
                   predicted_seconds=float(timings["predicted_ms"]) / 1000,
                   prompt_seconds=float(timings["prompt_ms"]) / 1000,
                   drafted=int(timings.get("draft_n", 0)), accepted=int(timings.get("draft_n_accepted", 0)))
