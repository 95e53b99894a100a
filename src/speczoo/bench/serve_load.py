"""The server under load: N concurrent streaming clients on one served runtime, each answer checked
against the same request served alone, and the aggregate tok/s (`speczoo serve-load`).

`run_serve_load(runtime, clients=8, max_tokens=64)` serves `runtime` through the real HTTP app on a
free loopback port (`parallel` > 1: its batch worker, `speczoo serve --parallel`), sends every
client's request alone (one after another: the reference answers; `alone` hands in those of an
earlier run to reuse), then all of them at once from `clients` threads. A client is a plain HTTP/1.1 streaming chat request
(`stream: true`, usage included) read line by line with the standard library, as any OpenAI client
would. The aggregate figure is the completion tokens of all concurrent clients over the wall time
from the first request sent to the last `[DONE]` (prefills and queueing included).

Nothing here loads a model (the caller hands in a runtime) or binds beyond 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# Short coding requests whose answers run well past 64 tokens, so every client generates its budget.
LOAD_PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome, with a docstring and tests.",
    "Implement binary search over a sorted list in Python and explain each step.",
    "Write a Python class for a stack with push, pop, peek and is_empty, with docstrings.",
    "Show how to read a CSV file in Python and compute the average of one column.",
    "Write a recursive and an iterative Python function for the n-th Fibonacci number.",
    "Explain Python list comprehensions with five examples of increasing difficulty.",
    "Write a Python function that merges two sorted lists into one sorted list, with tests.",
    "Implement a simple LRU cache class in Python without using functools.",
)


def load_prompt(i: int, category: str | None = None) -> str:
    """Client i's request: from LOAD_PROMPTS, or the first turns of the built-in questions of `category`
    (e.g. code_edit: long code to return edited); distinct for every i (a list repeats with a numbered
    variant)."""
    prompts = LOAD_PROMPTS if category is None else category_prompts(category)
    base = prompts[i % len(prompts)]
    return base if i < len(prompts) else f"{base} (variant {i // len(prompts) + 1})"


def category_prompts(category: str) -> tuple[str, ...]:
    """The first turns of the built-in questions of one category; a clear error for an unknown one."""
    from speczoo.bench.questions import CATEGORIES, builtin_questions

    prompts = tuple(q.turns[0] for q in builtin_questions() if q.category == category)
    if not prompts:
        raise ValueError(f"no built-in questions in category {category!r}; one of: {', '.join(CATEGORIES)}")
    return prompts


@dataclass
class StreamResult:
    """What one streaming client saw."""

    text: str
    finish_reason: str | None
    completion_tokens: int
    first_token_s: float    # request sent -> first piece of text
    seconds: float          # request sent -> [DONE]
    keepalives: int         # ': keep-alive' comments received


def stream_chat(host: str, port: int, body: dict, api_key: str | None = None,
                timeout: float = 600.0) -> StreamResult:
    """POST a streaming chat completion and read it to `[DONE]`; raise on any non-200 or error event."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"the server answered {resp.status}: {resp.read(500).decode(errors='replace')}")
        parts: list[str] = []
        first = finish = usage = None
        keepalives, done = 0, False
        for raw in resp:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line:
                continue
            if line.startswith(":"):
                keepalives += 1
                continue
            if not line.startswith("data: "):
                raise RuntimeError(f"not a server-sent event line: {line[:200]!r}")
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"the stream reported an error: {chunk['error'].get('message')}")
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                piece = choice["delta"].get("content")
                if piece:
                    first = first if first is not None else time.perf_counter() - t0
                    parts.append(piece)
                finish = choice.get("finish_reason") or finish
        seconds = time.perf_counter() - t0
    finally:
        conn.close()
    if not done:
        raise RuntimeError("the stream ended without data: [DONE]")
    if usage is None:
        raise RuntimeError("the stream carried no usage chunk (stream_options.include_usage)")
    return StreamResult(text="".join(parts), finish_reason=finish,
                        completion_tokens=usage["completion_tokens"],
                        first_token_s=first if first is not None else seconds, seconds=seconds,
                        keepalives=keepalives)


@dataclass
class LoadResult:
    model: str
    spec: str
    max_tokens: int
    alone: list[StreamResult]       # each request served with the server otherwise idle
    together: list[StreamResult]    # the same requests, all clients at once
    wall_seconds: float             # the concurrent phase: first request sent -> last [DONE]
    parallel: int = 1               # generations the server batched at once
    category: str | None = None     # the built-in category the prompts came from (None: LOAD_PROMPTS)
    bodies: list[dict] = field(default_factory=list)   # the chat requests sent, in client order

    @property
    def clients(self) -> int:
        return len(self.together)

    @property
    def identical(self) -> int:
        """Clients whose concurrent answer equals the same request served alone."""
        return sum((a.text, a.finish_reason, a.completion_tokens) == (t.text, t.finish_reason,
                                                                       t.completion_tokens)
                   for a, t in zip(self.alone, self.together))

    @property
    def ok(self) -> bool:
        return self.identical == self.clients and all(t.completion_tokens > 0 for t in self.together)

    @property
    def ttft(self) -> tuple[float, float]:
        """p50 and p95 of the concurrent clients' time to first token, in seconds."""
        return _p50_p95([t.first_token_s for t in self.together])

    @property
    def tpot(self) -> tuple[float, float]:
        """p50 and p95 of the concurrent clients' time per output token after the first, in seconds."""
        return _p50_p95([(t.seconds - t.first_token_s) / max(1, t.completion_tokens - 1) for t in self.together])

    @property
    def tokens(self) -> int:
        return sum(t.completion_tokens for t in self.together)

    @property
    def aggregate_tok_s(self) -> float:
        return self.tokens / self.wall_seconds

    @property
    def alone_tok_s(self) -> float:
        """Tokens per second of the same requests sent one after another (the no-contention rate)."""
        return sum(a.completion_tokens for a in self.alone) / sum(a.seconds for a in self.alone)

    def lines(self) -> list[str]:
        ttft = [t.first_token_s for t in self.together]
        full = sum(t.completion_tokens == self.max_tokens for t in self.together)
        prompts = "coding requests" if self.category is None else f"built-in {self.category} prompts"
        return [
            f"{self.clients} concurrent streaming clients on {self.model} (spec {self.spec}, greedy, "
            f"max_tokens {self.max_tokens}, {prompts}); {full}/{self.clients} used their whole budget",
            f"SERVE-LOAD IDENTICAL {self.identical}/{self.clients} {'PASS' if self.ok else 'FAIL'} "
            f"(each answer vs the same request served alone)",
            self.aggregate_line(),
            f"time to first token: median {statistics.median(ttft):.2f} s, max {max(ttft):.2f} s "
            f"({'one generation at a time, FIFO' if self.parallel == 1 else f'up to {self.parallel} batched'})",
            self.percentiles_line(),
        ]

    def aggregate_line(self) -> str:
        return (f"aggregate: {self.tokens} tokens in {self.wall_seconds:.2f} s = {self.aggregate_tok_s:.1f} tok/s "
                f"(the same requests one at a time: {self.alone_tok_s:.1f} tok/s)")

    def percentiles_line(self) -> str:
        return (f"p50/p95: time to first token {self.ttft[0]:.2f}/{self.ttft[1]:.2f} s, time per output token "
                f"{self.tpot[0] * 1e3:.1f}/{self.tpot[1] * 1e3:.1f} ms")


def _p50_p95(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def run_serve_load(runtime, clients: int = 8, max_tokens: int = 64, spec: str = "auto",
                   api_key: str | None = None, parallel: int = 1,
                   alone: list[StreamResult] | None = None, category: str | None = None) -> LoadResult:
    """Serve `runtime` on loopback and measure `clients` concurrent streams (see the module doc)."""
    from speczoo.serve.app import create_app
    from speczoo.serve.background import BackgroundServer
    from speczoo.serve.batch_worker import worker_for

    if clients < 1 or max_tokens < 1:
        raise ValueError(f"--clients and --max-tokens must be >= 1, got {clients} and {max_tokens}")
    bodies = [{"model": runtime.name, "max_tokens": max_tokens, "temperature": 0, "speculative": spec,
               "messages": [{"role": "user", "content": load_prompt(i, category)}]} for i in range(clients)]
    queue = max(64, clients)
    app = create_app(runtime, api_key=api_key, default_spec=spec, max_queue=queue,
                     worker=worker_for(runtime, parallel, queue))
    with BackgroundServer(app) as server:
        alone, together, wall = run_clients(server.host, server.port, bodies, api_key, alone)
    return LoadResult(model=runtime.name, spec=spec, max_tokens=max_tokens, alone=alone,
                      together=together, wall_seconds=wall, parallel=parallel, category=category,
                      bodies=bodies)


def run_clients(host: str, port: int, bodies: list[dict], api_key: str | None = None,
                alone: list[StreamResult] | None = None
                ) -> tuple[list[StreamResult], list[StreamResult], float]:
    """Every body alone (reusing the first ones of `alone`), then all at once from one thread each:
    (alone, together, wall seconds of the concurrent phase). Any HTTP server speaking the OpenAI
    streaming chat protocol will do (speczoo's app, llama.cpp's llama-server)."""
    def send(body: dict) -> StreamResult:
        return stream_chat(host, port, body, api_key)

    alone = (alone or [])[:len(bodies)]
    alone += [send(b) for b in bodies[len(alone):]]
    start = threading.Barrier(len(bodies))

    def client(body: dict) -> tuple[StreamResult, float]:
        start.wait()                      # all threads send together
        t0 = time.perf_counter()
        return send(body), t0

    with ThreadPoolExecutor(len(bodies)) as pool:
        out = list(pool.map(client, bodies))
    wall = max(t0 + r.seconds for r, t0 in out) - min(t0 for _, t0 in out)
    return alone, [r for r, _ in out], wall
