"""A real uvicorn server on 127.0.0.1 (random free port) driven by the official `openai` client:
chat and completions, streaming and not; faults (bad JSON, unknown model, over-context, wrong key);
a client dropped mid-stream (its generation is closed, the next request is served normally); and
8 concurrent streaming clients whose outputs equal the same requests served alone. Every test runs
twice: against the one-at-a-time worker and against `--parallel 4`'s batch worker (the API behaves the
same; the batch's own promises are test_serve_batch.py's)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import socket
import time

import httpx
import openai
import pytest

from fake_runtime import is_fake, make_test_runtime
from openai_chat import KEY, chat
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer
from speczoo.serve.batch_worker import BatchWorker


@pytest.fixture(scope="module", params=[1, 4], ids=["one-at-a-time", "parallel-4"])
def parallel(request) -> int:
    return request.param


@pytest.fixture(scope="module")
def runtime(parallel):
    return make_test_runtime(max_seq=512, delay=0.001)


@pytest.fixture(scope="module")
def server(runtime, parallel):
    worker = BatchWorker(runtime, parallel) if parallel > 1 else None
    with BackgroundServer(create_app(runtime, api_key=KEY, worker=worker)) as s:
        yield s


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def health(server) -> dict:
    return httpx.get(server.url + "/health", timeout=10).json()


def wait_idle(server, timeout=20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = health(server)
        if not h["busy"] and h["queued"] == 0:
            return h
        time.sleep(0.02)
    raise AssertionError(f"the server is still busy after {timeout} s: {health(server)}")


def stream_text(client, runtime, text, **kw) -> tuple[str, str]:
    parts, finish = [], None
    for chunk in chat(client, runtime, text, stream=True, **kw):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return "".join(parts), finish


def test_models(client, runtime):
    assert [m.id for m in client.models.list().data] == [runtime.name]


def test_chat_stream_and_not(client, runtime):
    r = chat(client, runtime, "hello", max_tokens=30, temperature=0)
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.usage.model_extra
    assert {"accepted_draft_tokens", "draft_tokens", "rounds"} <= set(extra)
    streamed, finish = stream_text(client, runtime, "hello", max_tokens=30, temperature=0)
    assert streamed == text and finish == r.choices[0].finish_reason


def test_stream_usage_and_extension_field(client, runtime):
    chunks = list(chat(client, runtime, "spec please", max_tokens=20, stream=True,
                       stream_options={"include_usage": True}, extra_body={"speculative": "ngram"}))
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens >= 1
    assert chunks[-1].usage.model_extra["drafter"] != "off"


def test_completions_stream_and_not(client, runtime):
    r = client.completions.create(model=runtime.name, prompt="def fib(n):", max_tokens=25, seed=3)
    text = r.choices[0].text
    assert text
    parts = [c.choices[0].text for c in client.completions.create(
        model=runtime.name, prompt="def fib(n):", max_tokens=25, seed=3, stream=True) if c.choices]
    assert "".join(parts) == text


def test_sampling_with_a_seed_is_reproducible(client, runtime):
    a = chat(client, runtime, "roll", max_tokens=20, temperature=0.8, top_p=0.95, seed=42)
    b = chat(client, runtime, "roll", max_tokens=20, temperature=0.8, top_p=0.95, seed=42)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_faults(client, server, runtime):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="not-a-model", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, runtime, "x", max_tokens=runtime.max_seq * 2)
    assert "context" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        chat(client, runtime, "x", temperature=-1)
    with pytest.raises(openai.BadRequestError):
        chat(client, runtime, "x", stream=True, max_tokens=runtime.max_seq * 2)
    with openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=runtime.name, messages=[{"role": "user", "content": "x"}])
    r = httpx.post(server.url + "/v1/chat/completions", content=b'{"model": ',
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    # the server is still healthy after all of that
    assert chat(client, runtime, "still alive?", max_tokens=5).choices[0].message.content is not None


class _Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def _open_stream_and_drop(server, runtime, max_tokens: int) -> None:
    """Start a streaming chat over a raw socket, read the first chunks, then close the connection."""
    body = json.dumps({"model": runtime.name, "stream": True, "max_tokens": max_tokens,
                       "speculative": "off",
                       "messages": [{"role": "user", "content": "a long answer, please"}]}).encode()
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while got.count(b"data: ") < 4:
            data = sock.recv(4096)
            assert data, "the server closed the stream before sending anything"
            got += data
        assert b" 200 " in got.split(b"\r\n", 1)[0]


def test_client_dropped_mid_stream_is_cancelled_and_next_request_is_served(client, server, runtime):
    if is_fake(runtime):
        runtime.delay = 0.02           # ~50 rounds/s: the stream is still running when we hang up
    try:
        alone = chat(client, runtime, "after the drop", max_tokens=20).choices[0].message.content
        before = wait_idle(server)
        n_log = len(runtime.log) if is_fake(runtime) else 0
        errors = _Errors()
        logging.getLogger("uvicorn.error").addHandler(errors)
        try:
            _open_stream_and_drop(server, runtime, max_tokens=400)
            after = wait_idle(server)
            time.sleep(0.2)
        finally:
            logging.getLogger("uvicorn.error").removeHandler(errors)
        assert not errors.records, f"the server failed handling the drop: {errors.records[0].getMessage()}"
        assert after["cancelled"] == before["cancelled"] + 1, "the dropped stream was not cancelled"
        assert after["served"] == before["served"], "the dropped stream ran to completion"
        if is_fake(runtime):
            dropped = runtime.log[n_log]
            assert dropped.closed_early and not dropped.finished
            assert dropped.events < 400
        again = chat(client, runtime, "after the drop", max_tokens=20).choices[0].message.content
        assert again == alone
    finally:
        if is_fake(runtime):
            runtime.delay = 0.001


def test_non_streaming_client_that_times_out_is_cancelled(server, runtime):
    if is_fake(runtime):
        runtime.delay = 0.02
    errors = _Errors()
    logging.getLogger("uvicorn.error").addHandler(errors)
    try:
        before = wait_idle(server)
        with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=0.3) as c:
            with pytest.raises(openai.APITimeoutError):
                chat(c, runtime, "slow", max_tokens=400)
        after = wait_idle(server)
        assert after["cancelled"] == before["cancelled"] + 1
        time.sleep(0.2)
        assert not errors.records, f"the server failed handling the disconnect: {errors.records[0].getMessage()}"
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
        if is_fake(runtime):
            runtime.delay = 0.001


def test_eight_concurrent_streams_equal_the_same_requests_served_alone(client, server, runtime):
    prompts = [f"question number {i}: {'why ' * i}" for i in range(8)]
    modes = ["off", "ngram", "auto", "off", "ngram", "auto", "off", "ngram"]
    kw = [dict(max_tokens=24 + 3 * i, extra_body={"speculative": modes[i]}) for i in range(8)]
    alone = [stream_text(client, runtime, p, **k) for p, k in zip(prompts, kw)]
    before = wait_idle(server)

    def one(i):
        with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120) as c:
            return stream_text(c, runtime, prompts[i], **kw[i])

    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one, range(8)))
    assert together == alone
    after = wait_idle(server)
    assert after["served"] == before["served"] + 8 and after["cancelled"] == before["cancelled"]
