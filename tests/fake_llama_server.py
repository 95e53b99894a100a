#!/usr/bin/env python3
"""A stand-in for llama.cpp's `llama-server`, for fast tests of `speczoo.bench.serve_load_llama`.

It takes llama-server's command line (only --host, --port and --parallel matter to it), answers /health
503 for its first moments and 200 after, and streams /v1/chat/completions as llama-server does: a role
chunk, one content chunk per "token", a finish chunk, a usage chunk with empty choices, `[DONE]`.
The answer is a pure function of the request's messages and max_tokens. `/completion` (the suite's
llama-server modes, token ids in and out) answers ids that are a pure function of the prompt's. Knobs, from the environment:
FAKE_LLAMA_ARGV (a file: its argv as JSON lines, one per start), FAKE_LLAMA_DIVERGE=1 (an answer
served while another is running ends with a different word, as a non-batch-invariant server might),
FAKE_LLAMA_FAIL=1 (print a line and exit 3 at start), FAKE_LLAMA_WRONG=SPEC_TYPE (a server started with
--spec-type SPEC_TYPE answers a /completion prompt that starts with id 99 with its 4th id off by one, as a
lossy speculative mode would). Standard library only; binds what it is told.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta")
STARTED = time.monotonic()
ACTIVE = [0]
LOCK = threading.Lock()


def answer(messages: list[dict], n: int) -> list[str]:
    seed = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).digest()
    return [f" {WORDS[seed[i % len(seed)] % len(WORDS)]}" for i in range(n)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        ready = self.path == "/health" and time.monotonic() - STARTED > 0.3
        body = b'{"status":"ok"}' if ready else b'{"error":"loading"}'
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _event(self, obj) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/completion":
            self._complete(req)
            return
        if "speculative" in req:
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with LOCK:
            ACTIVE[0] += 1
        try:
            self._stream(req)
        finally:
            with LOCK:
                ACTIVE[0] -= 1

    def _complete(self, req: dict) -> None:
        """/completion on token ids: ids a pure function of the prompt's; a speculative start (--spec-type
        on its command line) drafts every token, accepts half, and is twice as fast."""
        spec = "--spec-type" in sys.argv
        n = req["n_predict"]
        ids = [100 + (sum(req["prompt"]) + 7 * i) % 50 for i in range(n)]
        wrong = os.environ.get("FAKE_LLAMA_WRONG")
        if spec and wrong and sys.argv[sys.argv.index("--spec-type") + 1] == wrong and req["prompt"][0] == 99 and n > 3:
            ids[3] += 1
        timings = {"prompt_n": len(req["prompt"]), "prompt_ms": 1.0 * len(req["prompt"]), "predicted_n": n,
                   "predicted_ms": (5.0 if spec else 10.0) * n}
        if spec:
            timings.update(draft_n=n, draft_n_accepted=n // 2)
        body = json.dumps({"content": "".join(chr(i) for i in ids), "tokens": ids, "stop_type": "limit",
                           "timings": timings}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, req: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        pieces = answer(req["messages"], req["max_tokens"])
        chunk = {"object": "chat.completion.chunk", "model": req["model"]}
        self._event({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})
        for i, piece in enumerate(pieces):
            time.sleep(0.002)
            if i == len(pieces) - 1 and os.environ.get("FAKE_LLAMA_DIVERGE") and ACTIVE[0] > 1:
                piece = " different"
            self._event({**chunk, "choices": [{"index": 0, "delta": {"content": piece}}]})
        self._event({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        self._event({**chunk, "choices": [], "usage": {"completion_tokens": len(pieces), "prompt_tokens": 9,
                                                      "total_tokens": len(pieces) + 9}})
        self._event("[DONE]")
        self.close_connection = True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    args, _ = p.parse_known_args()
    if os.environ.get("FAKE_LLAMA_ARGV"):
        with open(os.environ["FAKE_LLAMA_ARGV"], "a") as f:
            f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid()}) + "\n")
    if os.environ.get("FAKE_LLAMA_FAIL"):
        print("error: failed to load model", flush=True)
        sys.exit(3)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
