"""`speczoo serve --parallel N` (serve/batch_worker.py) behind the official `openai` client on a real
uvicorn server (test_serve_openai.py runs every API test against the batch worker too), and the batch's
own promises hold: concurrent streams equal
the same requests served alone, a disconnected client's slot is free within a step, and a full server
answers 503 with Retry-After."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import openai
import pytest

from fake_runtime import FakeRuntime, make_test_runtime
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer
from speczoo.serve.batch_worker import BatchWorker, default_parallel
from openai_chat import KEY, chat


@pytest.fixture(scope="module")
def runtime():
    return make_test_runtime(max_seq=512, delay=0.001)


@pytest.fixture(scope="module")
def server(runtime):
    worker = BatchWorker(runtime, 4)
    with BackgroundServer(create_app(runtime, api_key=KEY, worker=worker)) as s:
        s.worker = worker
        yield s


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_concurrent_streams_share_the_batch_and_equal_solo(client, server, runtime):
    prompts = [f"question {i}" for i in range(6)]
    alone = [chat(client, runtime, p, max_tokens=40).choices[0].message.content for p in prompts]

    def stream(p: str) -> str:
        parts = chat(client, runtime, p, max_tokens=40, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)

    steps = server.worker.batch.steps
    with cf.ThreadPoolExecutor(6) as pool:
        together = list(pool.map(stream, prompts))
    assert together == alone
    if isinstance(runtime, FakeRuntime):        # they shared steps: far fewer than one per event each
        assert server.worker.batch.steps - steps < sum(len(t) for t in together)


def test_a_disconnected_client_frees_its_slot():
    """A generation that would run for 10 s more leaves its slot soon after its client goes (a slow
    runtime: with a fast one the answer could end before the client read its first event, on a loaded
    machine)."""
    slow = FakeRuntime(max_seq=512, delay=0.05, answer_words=200)
    worker = BatchWorker(slow, 2)
    with BackgroundServer(create_app(slow, api_key=KEY, worker=worker)) as s:
        with httpx.stream("POST", s.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                          json={"model": slow.name, "messages": [{"role": "user", "content": "long"}],
                                "max_tokens": 300, "stream": True}, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break
            wait_for(lambda: worker.running == 1, timeout=5)     # admitted (a loaded machine may lag)
        wait_for(lambda: worker.running == 0, timeout=5)


def test_a_full_server_answers_503_with_retry_after():
    slow = FakeRuntime(max_seq=512, delay=0.05, answer_words=200)
    worker = BatchWorker(slow, 1, max_queue=1)
    with BackgroundServer(create_app(slow, api_key=KEY, worker=worker)) as s, \
            openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=60) as client:
        body = {"model": slow.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 300,
                "stream": True}
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.stream("POST", s.url + "/v1/chat/completions", headers=headers, json=body, timeout=30), \
                httpx.stream("POST", s.url + "/v1/chat/completions", headers=headers, json=body, timeout=30):
            wait_for(lambda: worker.running == 1 and worker.queued == 1)
            with pytest.raises(openai.APIStatusError) as err:
                chat(client, slow, "one too many", max_tokens=5)
            assert err.value.status_code == 503
            assert err.value.response.headers["retry-after"] == "1"


def test_the_default_parallel_is_bounded_by_memory():
    n, line = default_parallel(1 << 30, available=3 << 30)
    assert n == 1 and "1 sequences" in line
    assert default_parallel(1 << 20, available=64 << 30)[0] == 8


def test_metrics_parse_and_count(client, server, runtime):
    from prometheus_client.parser import text_string_to_metric_families

    chat(client, runtime, "count me", max_tokens=12)
    text = httpx.get(server.url + "/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {s.name: s.value for f in families.values() for s in f.samples}
    assert {"speczoo_requests_running", "speczoo_requests_waiting", "speczoo_batch_size", "speczoo_generated_tokens",
            "speczoo_accepted_per_round", "speczoo_time_to_first_token_seconds"} <= set(families)
    assert value["speczoo_generated_tokens_total"] >= 12
    assert value["speczoo_time_to_first_token_seconds_count"] >= 1
    wait_for(lambda: server.worker.running == 0)
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert "speczoo_requests_running 0.0" in text


@pytest.mark.slow
def test_a_bounded_soak_leaks_no_slot_and_answers_no_5xx():
    """Eight clients for a while against --parallel 4 and a short queue: streams read to the end or
    dropped midway, bad requests mixed in; no 5xx but the queue's 503, and nothing left running after
    (the soak of `speczoo serve-soak`, speczoo.bench.soak, on the fake runtime)."""
    from speczoo.bench.soak import run_soak
    from speczoo.bench.soak_requests import BY_NAME

    rt = FakeRuntime(max_seq=512, delay=0.002, answer_words=60)
    res = run_soak(rt, 20, clients=8, parallel=4, max_queue=4, max_tokens=200, sample_every=1.0, api_key=KEY)
    statuses = [o.status for o in res.outcomes if o.status is not None]
    print("\n".join(res.lines()))
    assert res.idle and res.last.running == 0 and res.last.waiting == 0
    assert not res.failures and res.five_xx == 0
    assert set(statuses) <= {200, 400, 404, 503} and statuses.count(200) > 50
    assert all(o.status != 404 or o.kind == "unknown-model" for o in res.outcomes)
    assert all(o.status in BY_NAME[o.kind].expect or o.left for o in res.outcomes)
