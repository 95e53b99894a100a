"""The soak's request mix: what one soak client sends, how it behaves, and what answer each kind expects.

`KINDS` names every kind of request with its weight in the mix and the statuses it may get. Valid
requests (streamed or whole, greedy or sampled with a seed, spec modes off/auto/ngram, varied
max_tokens) expect 200, or a 503 with code `queue_full` when the server's queue is full: that answer
says "retry later" and is the bounded queue working, not a failure. Some valid clients leave on
purpose: a stream dropped after a random number of lines, a whole answer abandoned after a random
read timeout. Bad requests (a body that is not JSON, temperature -1, top_k -1, an unknown speculative
mode, an unknown model, a prompt longer than the cache, no messages) expect their 4xx.

`send(client, kind, rng, ctx)` sends one request of `kind` over an `httpx.Client` and returns what
happened as an `Outcome`; it raises nothing for a server's misbehaviour (a 5xx, an error inside a
200 stream, a stream without `[DONE]`): that is the outcome to count. Never starts a server and
never reads a model.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import httpx

from speczoo.bench.serve_load import load_prompt

CHAT = "/v1/chat/completions"
OK = frozenset({200, 503})          # a valid request: answered, or the full queue's "retry later"


@dataclass(frozen=True)
class Kind:
    name: str
    weight: float               # share of the mix, relative to the other kinds
    expect: frozenset[int]      # statuses this kind may get
    bad: bool = False           # a malformed request: it must be refused with a 4xx


KINDS = (
    Kind("stream", 24, OK),
    Kind("whole", 14, OK),
    Kind("sampled", 12, OK),          # temperature > 0 with a seed, streamed or whole
    Kind("disconnect", 12, OK),       # a stream the client drops midway
    Kind("walk-away", 6, OK),         # a whole answer the client stops waiting for
    Kind("bad-json", 5, frozenset({400}), bad=True),
    Kind("bad-temperature", 5, frozenset({400}), bad=True),
    Kind("bad-top-k", 4, frozenset({400}), bad=True),
    Kind("bad-spec", 4, frozenset({400}), bad=True),
    Kind("unknown-model", 4, frozenset({404}), bad=True),
    Kind("too-long", 5, frozenset({400}), bad=True),
    Kind("no-messages", 5, frozenset({400}), bad=True),
)
BY_NAME = {k.name: k for k in KINDS}


@dataclass(frozen=True)
class Context:
    """What a client needs to know about the server to build its requests."""

    model: str
    max_seq: int                # the served context: prompts and max_tokens stay inside it
    spec_modes: tuple[str, ...] # the modes valid requests pick from (off, auto, ngram where offered)
    max_tokens: int             # the most tokens a valid request asks for


@dataclass(frozen=True)
class Outcome:
    """What one request got. status None: no HTTP status (the client left before it, or the connection
    failed); problem: what the server did wrong beyond its status ("" when nothing)."""

    kind: str
    status: int | None
    problem: str = ""
    left: bool = False          # the client left on purpose before the end of the answer

    @property
    def label(self) -> str:
        """How the report counts it: the status, 'left' or 'no answer', and a problem's mark."""
        text = str(self.status) if self.status is not None else ("left" if self.left else "no answer")
        if self.left and self.status is not None:
            text += " left"
        return f"{text} !{self.problem.split(':')[0]}" if self.problem else text


def pick(rng: random.Random, mix: tuple[Kind, ...] = KINDS) -> Kind:
    """A kind drawn from `mix` by weight."""
    return rng.choices(mix, weights=[k.weight for k in mix])[0]


def valid_body(rng: random.Random, ctx: Context, stream: bool) -> dict:
    """A valid chat request: a short coding prompt, a random spec mode and max_tokens, greedy."""
    room = max(1, min(ctx.max_tokens, ctx.max_seq // 2))
    prompt = load_prompt(rng.randrange(64))[: ctx.max_seq // 4]   # chars >= tokens: a quarter at most
    body = {"model": ctx.model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": rng.randint(1, room), "stream": stream,
            "speculative": rng.choice(ctx.spec_modes)}
    if stream:
        body["stream_options"] = {"include_usage": rng.random() < 0.5}
    return body


def bad_body(kind: str, rng: random.Random, ctx: Context) -> dict:
    """A request the server must refuse (kind 'bad-json' is sent as raw bytes by `send`)."""
    body = valid_body(rng, ctx, stream=rng.random() < 0.5)
    if kind == "bad-temperature":
        body["temperature"] = -1
    elif kind == "bad-top-k":
        body["top_k"] = -1
    elif kind == "bad-spec":
        body["speculative"] = "bogus"
    elif kind == "unknown-model":
        body["model"] = ctx.model + "-not-served"
    elif kind == "too-long":       # every " word" is at least one token: more tokens than the cache holds
        body["messages"][0]["content"] = " word" * (ctx.max_seq + 16)
    elif kind == "no-messages":
        del body["messages"]
    else:
        raise ValueError(f"not a bad request kind: {kind!r}")
    return body


def send(client: httpx.Client, kind: Kind, rng: random.Random, ctx: Context) -> Outcome:
    """Send one request of `kind` and judge the answer (see the module doc)."""
    try:
        if kind.name == "bad-json":
            raw = json.dumps(valid_body(rng, ctx, stream=False))[:-7].encode()   # cut: not JSON
            r = client.post(CHAT, content=raw, headers={"Content-Type": "application/json"})
            return _whole(kind, r)
        if kind.bad:
            return _whole(kind, client.post(CHAT, json=bad_body(kind.name, rng, ctx)))
        if kind.name == "walk-away":
            return _walk_away(client, kind, rng, ctx)
        stream = kind.name in ("stream", "disconnect") or (kind.name == "sampled" and rng.random() < 0.5)
        body = valid_body(rng, ctx, stream)
        if kind.name == "sampled":
            body.update(temperature=round(rng.uniform(0.3, 1.2), 2), seed=rng.randrange(2**31),
                        top_p=rng.choice([1.0, 0.9]), top_k=rng.choice([0, 20]))
        if not stream:
            return _whole(kind, client.post(CHAT, json=body))
        leave_after = rng.randint(0, body["max_tokens"] + 2) if kind.name == "disconnect" else None
        return _stream(client, kind, body, leave_after)
    except httpx.HTTPError as exc:
        return Outcome(kind.name, None, f"connection: {type(exc).__name__}: {exc}")


def _whole(kind: Kind, r: httpx.Response) -> Outcome:
    """A whole (non-streamed) answer: its status, and for a 200 a finished choice; for a 503 the queue's
    code and Retry-After."""
    problem = ""
    if r.status_code == 200:
        try:
            finish = r.json()["choices"][0].get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            finish = f"none ({type(exc).__name__}: {exc})"
        problem = "" if finish in ("stop", "length") else f"bad answer: finish_reason {finish!r}"
    elif r.status_code == 503:
        problem = _queue_full_problem(r)
    return Outcome(kind.name, r.status_code, problem)


def _queue_full_problem(r: httpx.Response) -> str:
    """'' for the full queue's 503 (code queue_full, with Retry-After), else what is wrong with it."""
    try:
        code = r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    if code == "queue_full" and r.headers.get("retry-after"):
        return ""
    return f"503 not from a full queue: code {code!r}, Retry-After {r.headers.get('retry-after')!r}"


def _walk_away(client: httpx.Client, kind: Kind, rng: random.Random, ctx: Context) -> Outcome:
    """A whole answer the client waits for only a random while (then closes the connection)."""
    body = valid_body(rng, ctx, stream=False)
    try:
        r = client.post(CHAT, json=body, timeout=httpx.Timeout(10.0, read=rng.uniform(0.05, 3.0)))
    except httpx.ReadTimeout:
        return Outcome(kind.name, None, left=True)
    return _whole(kind, r)


def _stream(client: httpx.Client, kind: Kind, body: dict, leave_after: int | None) -> Outcome:
    """A streamed answer read to `[DONE]`, or dropped after `leave_after` lines (closing the connection)."""
    with client.stream("POST", CHAT, json=body) as r:
        if r.status_code != 200:
            r.read()
            return _whole(kind, r)
        for i, line in enumerate(r.iter_lines()):
            if leave_after is not None and i >= leave_after:
                return Outcome(kind.name, 200, left=True)
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                return Outcome(kind.name, 200)
            try:
                chunk = json.loads(data)
            except ValueError:
                return Outcome(kind.name, 200, f"stream garbled: not JSON: {data[:80]!r}")
            if "error" in chunk:
                return Outcome(kind.name, 200, f"stream error: {chunk['error'].get('message')}")
    return Outcome(kind.name, 200, "stream cut: it ended without data: [DONE]")
