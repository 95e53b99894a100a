"""Ollama's API (serve/ollama.py) on a real uvicorn server, driven by the official `ollama` client: chat and
generate, streamed (NDJSON, Ollama's default) and whole, with the same answer in every speculative mode;
/api/tags, /api/show, /api/ps, /api/version; log-probabilities; errors in Ollama's shape with the right
status; the API key. The fast tests run on the fake runtime against the one-at-a-time worker and the
batch worker; the `real` ones on the pulled qwen2.5-coder-0.5b, speculation on and off."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from fake_runtime import make_test_runtime
from openai_chat import KEY
from real_models import real_runtime
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer
from speczoo.serve.batch_worker import BatchWorker

HI = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module", params=[1, 3], ids=["one-at-a-time", "parallel-3"])
def served(request):
    rt = make_test_runtime(max_seq=512, delay=0.001)
    worker = BatchWorker(rt, request.param) if request.param > 1 else None
    with BackgroundServer(create_app(rt, api_key=KEY, worker=worker)) as s:
        yield rt, s


@pytest.fixture
def runtime(served):
    return served[0]


@pytest.fixture
def server(served) -> BackgroundServer:
    return served[1]


@pytest.fixture
def client(server) -> ollama.Client:
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def raw_chat(url: str, body: dict, headers: dict | None = None) -> dict:
    """A whole /api/chat answer as JSON, with the speczoo extension the client's models drop."""
    r = httpx.post(url + "/api/chat", json={"stream": False, **body}, headers=headers or {}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def token_bytes(token: str) -> bytes:
    """A token's bytes from its text (a piece of a UTF-8 character is written `bytes:\\xNN...`)."""
    return bytes.fromhex(token[6:].replace("\\x", "")) if token.startswith("bytes:") else token.encode()


def streamed(parts) -> tuple[str, object]:
    """The text of a streamed chat or generate, and its last line."""
    parts = list(parts)
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    return "".join(p.message.content if isinstance(p, ollama.ChatResponse) else p.response for p in parts), parts[-1]


def test_chat_whole_and_streamed_are_the_same_answer_in_every_mode(client, server, runtime):
    whole = client.chat(model=runtime.name, messages=HI, options={"num_predict": 24})
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
    assert whole.eval_count <= 24 and whole.prompt_eval_count > 0
    assert whole.total_duration >= whole.eval_duration >= 0 and whole.load_duration == 0
    for mode in ("off", "ngram", "auto"):
        text, last = streamed(client.chat(model=runtime.name, messages=HI, stream=True,
                                          options={"num_predict": 24, "speculative": mode}))
        assert text == whole.message.content, mode
        assert last.done_reason == whole.done_reason and last.eval_count == whole.eval_count
        ext = raw_chat(server.url, {"model": runtime.name, "messages": HI,
                                    "options": {"num_predict": 24, "speculative": mode}},
                       {"Authorization": f"Bearer {KEY}"})
        assert ext["message"]["content"] == whole.message.content and ext["speczoo"]["drafter"] == mode


def test_generate_templated_raw_and_continued(client, runtime):
    g = client.generate(model=f"{runtime.name}:latest", prompt="def fib(n):", options={"num_predict": 12})
    text, last = streamed(client.generate(model=runtime.name, prompt="def fib(n):", stream=True,
                                          options={"num_predict": 12}))
    assert text == g.response and last.context == g.context
    assert len(g.context) == g.prompt_eval_count + g.eval_count
    raw = client.generate(model=runtime.name, prompt="def fib(n):", raw=True, options={"num_predict": 12})
    assert raw.prompt_eval_count < g.prompt_eval_count               # no chat template around it
    more = client.generate(model=runtime.name, prompt="again", context=g.context, options={"num_predict": 4})
    assert more.prompt_eval_count > len(g.context)
    system = client.generate(model=runtime.name, prompt="def fib(n):", system="Answer in one short line. " * 8,
                             options={"num_predict": 4})      # longer than any template's default system prompt
    assert system.prompt_eval_count > g.prompt_eval_count


def test_an_empty_request_only_loads_the_model(client, runtime):
    assert client.chat(model=runtime.name, messages=[]).done_reason == "load"
    assert client.generate(model=runtime.name).done_reason == "load"


def test_sampling_options_and_stop(client, runtime):
    kw = dict(model=runtime.name, messages=HI)
    a = client.chat(**kw, options={"num_predict": 16, "temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 7})
    b = client.chat(**kw, options={"num_predict": 16, "temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 7})
    assert a.message.content == b.message.content
    greedy = client.chat(**kw, options={"num_predict": 30}).message.content
    cut = greedy.split()[2]
    stopped = client.chat(**kw, options={"num_predict": 30, "stop": [cut]})
    assert stopped.done_reason == "stop" and stopped.message.content == greedy[:greedy.index(cut)]
    # options that only tune Ollama's own loading are accepted and change nothing
    same = client.chat(**kw, options={"num_predict": 30, "num_ctx": 2048, "num_thread": 2, "repeat_penalty": 1.0})
    assert same.message.content == greedy


def test_logprobs_whole_and_streamed(client, runtime):
    kw = dict(model=runtime.name, messages=HI, logprobs=True, top_logprobs=3, options={"num_predict": 20})
    whole = client.chat(**kw)
    parts = list(client.chat(**kw, stream=True))
    lps = [lp for p in parts for lp in (p.logprobs or [])]
    assert lps == list(whole.logprobs) and len(lps) == whole.eval_count
    assert b"".join(token_bytes(lp.token) for lp in lps).decode() == whole.message.content
    assert all(len(lp.top_logprobs) == 3 and lp.logprob <= 0 for lp in lps)
    assert client.chat(model=runtime.name, messages=HI, options={"num_predict": 4}).logprobs is None


def test_catalogue(client, server, runtime):
    [model] = client.list().models
    assert model.model == runtime.name and model.size > 0 and model.digest.startswith("sha256:")
    assert model.details.format == "gguf" and model.details.quantization_level
    show = client.show(runtime.name)
    assert show.template and show.capabilities == ["completion"]
    assert show.modelinfo[f"{show.details.family}.context_length"] == runtime.max_seq
    assert [m.model for m in client.ps().models] == [runtime.name]
    version = httpx.get(server.url + "/api/version", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert version["version"].count(".") == 2


@pytest.mark.parametrize("kw, status, words", [
    (dict(model="llama3:latest"), 404, "not found"),
    (dict(options={"repeat_penalty": 1.1}), 400, "repeat_penalty"),
    (dict(options={"speculative": "nope"}), 400, "speculative"),
    (dict(options={"temperature": -1}), 400, "temperature"),
    (dict(options={"num_predict": 100_000}), 400, "num_predict"),
    (dict(format={"type": "object", "properties": {"a": {"type": "nonsense"}}}), 400, "format"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    (dict(top_logprobs=2), 400, "logprobs"),
])
def test_errors_in_ollamas_shape(client, runtime, kw, status, words):
    kw = {"model": runtime.name, "messages": HI, **kw}
    for stream in (False, True):
        with pytest.raises(ollama.ResponseError) as e:
            list(client.chat(**kw, stream=True)) if stream else client.chat(**kw)
        assert e.value.status_code == status and words in e.value.error


def test_bad_bodies_and_the_api_key(server, runtime):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.url + "/api/chat", content=b'{"model": ', headers=auth)
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    r = httpx.post(server.url + "/api/generate", json={"model": runtime.name, "prompt": 3}, headers=auth)
    assert r.status_code == 400 and "prompt" in r.json()["error"]
    r = httpx.post(server.url + "/api/generate", headers=auth,
                   json={"model": runtime.name, "prompt": "x", "context": [runtime.vocab_size]})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=server.url).list()
    assert e.value.status_code == 401 and "API key" in e.value.error
    r = httpx.post(server.url + "/api/chat", json={"model": runtime.name, "messages": HI, "stream": False,
                                                   "options": {"num_predict": 3}}, headers=auth)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    with httpx.stream("POST", server.url + "/api/chat", headers=auth,
                      json={"model": runtime.name, "messages": HI, "options": {"num_predict": 3}}) as r:
        assert r.headers["content-type"] == "application/x-ndjson" and r.read().count(b"\n") >= 2


@pytest.mark.real
def test_the_real_05b_through_the_ollama_client_speculation_on_and_off():
    """The official client against the real qwen2.5-coder-0.5b served with --spec auto: chat (streamed and
    whole) and generate give the answer of plain greedy decoding, and the same log-probabilities."""
    rt = real_runtime(max_seq=1024)
    ask = [{"role": "user", "content": "Repeat this line exactly: def add(a, b): return a + b"}]
    with BackgroundServer(create_app(rt, default_spec="auto")) as s:
        client = ollama.Client(host=s.url, timeout=600)
        plain = client.chat(model=rt.name, messages=ask, logprobs=True, top_logprobs=2,
                            options={"num_predict": 32, "speculative": "off"})
        spec = client.chat(model=rt.name, messages=ask, logprobs=True, top_logprobs=2, options={"num_predict": 32})
        assert "def add" in plain.message.content and spec.message.content == plain.message.content
        ext = raw_chat(s.url, {"model": rt.name, "messages": ask, "options": {"num_predict": 32}})
        assert ext["message"]["content"] == plain.message.content and ext["speczoo"]["drafter"] == "auto"
        assert ext["speczoo"]["accepted_draft_tokens"] > 0                        # speculation did work
        assert [(p.token, p.logprob, p.top_logprobs) for p in spec.logprobs] == \
            [(p.token, p.logprob, p.top_logprobs) for p in plain.logprobs]
        text, last = streamed(client.chat(model=rt.name, messages=ask, stream=True, options={"num_predict": 32}))
        assert text == plain.message.content and last.eval_count == plain.eval_count
        g = client.generate(model=rt.name, prompt="Write a haiku about caches.", options={"num_predict": 16})
        assert g.response and g.eval_count == 16 and g.done_reason == "length"
        assert [m.model for m in client.list().models] == [rt.name]
        show = client.show(rt.name)
        assert show.details.family == "qwen2" and show.details.quantization_level == "Q4_K_M"
        assert "im_start" in show.template
        # format: a JSON schema the answer is decoded inside, the same answer with speculation as without
        schema = {"type": "object", "properties": {"name": {"type": "string"}, "year": {"type": "integer"}},
                  "required": ["name", "year"], "additionalProperties": False}
        about = [{"role": "user", "content": "Python's first release as JSON: its name and year."}]
        shaped = [client.chat(model=rt.name, messages=about, format=schema,
                              options={"num_predict": 40, "speculative": mode}).message.content
                  for mode in ("off", "auto")]
        assert shaped[0] == shaped[1]
        assert set(json.loads(shaped[0])) == {"name", "year"}
