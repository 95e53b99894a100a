#!/usr/bin/env python3
"""A stand-in for vLLM's OpenAI server, for fast tests of `speczoo.bench.peers_vllm`.

Run as `python fake_vllm_server.py -m vllm.entrypoints.openai.api_server --model DIR --port P ...` (the
fake venv's bin/python execs it with that command line). It starts a child process, as vLLM starts its
engine core and worker, in its own process group; answers /v1/models 503 for its first moments and 200
after; and streams /v1/completions on token ids as vLLM does with `return_token_ids`: one chunk per token
(two per chunk when started with --speculative-config, as a speculative round emits several), each with
`text` and `token_ids`, then a finish chunk. The ids are a pure function of the prompt's, so every mode
answers alike; /metrics counts 4 drafted and 3 accepted tokens per answer on a speculative start, as
vLLM's Prometheus counters do; a prompt holding 999 meets the first of `stop_token_ids` as its fourth token, which vLLM
also returns in `token_ids`. Knobs, from the environment: FAKE_VLLM_LOG (a file: one JSON line per start
with argv, pid, the child's pid and the environment's vLLM variables), FAKE_VLLM_FAIL=1 (print an error
and exit 3 at start), FAKE_VLLM_NEVER_READY=1 (never answer 200). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTED = time.monotonic()
SERVED = [0]          # answers finished: a speculative start counts 4 drafted and 3 accepted tokens per answer
ENV_KEYS = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "HF_HUB_OFFLINE", "LD_PRELOAD", "PYTHONPATH")


def answer(prompt: list[int], n: int, stop: list[int]) -> list[int]:
    ids = [100 + (sum(prompt) + 7 * i) % 50 for i in range(n)]
    if 999 in prompt and stop and n > 3:
        ids = ids[:3] + [stop[0]]
    return ids


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/metrics":
            spec = "--speculative-config" in sys.argv
            body = (f'# HELP x\nvllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="target"}} '
                    f'{4.0 * SERVED[0]}\nvllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {3.0 * SERVED[0]}\n'
                    if spec else "# HELP x\nvllm:num_requests_running 0.0\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        ready = (self.path == "/v1/models" and time.monotonic() - STARTED > 0.3
                 and not os.environ.get("FAKE_VLLM_NEVER_READY"))
        body = json.dumps({"object": "list", "data": [{"id": "target"}]} if ready else {"error": "loading"}).encode()
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
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        ids = answer(req["prompt"], req["max_tokens"], req.get("stop_token_ids") or [])
        step = 2 if "--speculative-config" in sys.argv else 1
        base = {"object": "text_completion", "model": req["model"]}
        for i in range(0, len(ids), step):
            part = ids[i:i + step]
            time.sleep(0.002)
            self._event({**base, "choices": [{"index": 0, "text": "".join(f"<{t}>" for t in part),
                                              "token_ids": part, "finish_reason": None}]})
        finish = "stop" if ids and ids[-1] in (req.get("stop_token_ids") or []) else "length"
        SERVED[0] += 1
        self._event({**base, "choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": finish}]})
        self._event("[DONE]")
        self.close_connection = True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-m", dest="module")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    args, _ = p.parse_known_args()
    if os.environ.get("FAKE_VLLM_FAIL"):
        print("ValueError: the fake vLLM cannot load this model", flush=True)
        sys.exit(3)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])   # the "engine core"
    if os.environ.get("FAKE_VLLM_LOG"):
        with open(os.environ["FAKE_VLLM_LOG"], "a") as f:
            f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid(), "child": child.pid,
                                "env": {k: os.environ.get(k) for k in ENV_KEYS}}) + "\n")
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
