"""Tools on Ollama's /api/chat (serve/ollama.py) through a real uvicorn server and the official `ollama`
client: Ollama's tools, assistant calls (arguments as objects) and `tool` results rendered as the OpenAI
route renders them; the model's calls read into `message.tool_calls`, whole and streamed (NDJSON); a
malformed call kept as text; request mistakes as 400s in Ollama's shape.

Fast tests script the answer on the fake runtime, one byte per round, so every way a call can be cut
across stream lines is exercised. The `real` test runs the whole tool loop (call, tool result, answer) on
the pulled qwen2.5-coder-0.5b with the official client, and proves speculation lossless: every mode,
streamed and whole, gives plain greedy's calls, text and tokens.
"""

from __future__ import annotations

import json

import httpx
import ollama
import pytest
from real_models import real_runtime

from openai_chat import KEY
from tool_chat import ASK, CALL, HERMES_TEMPLATE, WEATHER, fake_tool_server
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer

AUTH = {"Authorization": f"Bearer {KEY}"}


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, dict(c.function.arguments)) for c in message.tool_calls or []]


def whole(client, model, messages, **kw) -> tuple[str, list]:
    """(content, [(name, arguments)]) of a non-streamed answer."""
    r = client.chat(model=model, messages=messages, **kw)
    return r.message.content, calls_of(r.message)


def streamed(client, model, messages, **kw) -> tuple[str, list]:
    """The same two of a streamed answer, put together from its lines as an Ollama client does."""
    content, calls = "", []
    for part in client.chat(model=model, messages=messages, stream=True, **kw):
        content += part.message.content or ""
        calls += calls_of(part.message)
    return content, calls


def raw_lines(url: str, body: dict) -> list[dict]:
    """A streamed /api/chat's lines as JSON (with the speczoo extension the client's models drop)."""
    with httpx.stream("POST", url + "/api/chat", json=body, headers=AUTH, timeout=600) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        return [json.loads(line) for line in r.iter_lines() if line]


# ---------------------------------------------------------------- fast: scripted answers on the fake

@pytest.fixture(scope="module", params=[1, 3], ids=["one-at-a-time", "parallel-3"])
def fake(request):
    with fake_tool_server(request.param) as (rt, server):
        yield rt, server, ollama.Client(host=server.url, headers=AUTH, timeout=120)


@pytest.mark.parametrize("answer, expected, error", [
    ("Looking.\n" + CALL, ("Looking.", [("get_weather", {"city": "Paris"})]), None),
    (CALL + CALL, ("", [("get_weather", {"city": "Paris"})] * 2), None),
    ("<tool_call>{city: Paris}</tool_call>", ("<tool_call>{city: Paris}</tool_call>", []), "not valid JSON"),
    ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
     ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', []), "'rm', which is not among the tools"),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"ci', ('<tool_call>\n{"name": "get_weather", "arguments": {"ci', []),
     "ended inside a tool call"),
    ("It is sunny.", ("It is sunny.", []), None),
], ids=["call", "two-calls", "bad-json", "unknown-function", "unclosed", "no-call"])
def test_a_scripted_answer_whole_and_streamed_byte_by_byte(fake, answer, expected, error):
    rt, server, client = fake
    rt.answer_text = answer
    assert whole(client, rt.name, ASK, tools=[WEATHER]) == expected
    assert streamed(client, rt.name, ASK, tools=[WEATHER]) == expected
    body = {"model": rt.name, "messages": ASK, "tools": [WEATHER]}
    last = httpx.post(server.url + "/api/chat", json={**body, "stream": False}, headers=AUTH).json()
    lines = raw_lines(server.url, body)
    for got in (last["speczoo"].get("tool_call_error"), lines[-1]["speczoo"].get("tool_call_error")):
        assert (got is None) if error is None else error in got       # why the text is not a call
    assert last["done_reason"] == "stop"                               # Ollama's, even after a call


def test_a_streamed_call_comes_whole_in_one_line_in_ollamas_shape(fake):
    rt, server, _ = fake
    rt.answer_text = "Looking.\n" + CALL
    lines = raw_lines(server.url, {"model": rt.name, "messages": ASK, "tools": [WEATHER]})
    with_calls = [line for line in lines if "tool_calls" in line["message"]]
    assert len(with_calls) == 1 and not with_calls[0]["done"]
    assert with_calls[0]["message"] == {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]}
    shown = "".join(line["message"]["content"] for line in lines)
    assert shown == "Looking." and "<tool_call>" not in shown       # the call's markup is never shown
    assert lines[-1]["done"] and all(not line["done"] for line in lines[:-1])


def test_the_loop_renders_as_the_openai_route_renders_it(fake):
    """Ollama's turns (a call with its arguments as an object, a result with tool_name) give the prompt the
    OpenAI route gives the same conversation: the one code path renders both."""
    rt, server, client = fake
    rt.answer_text = "It is 18 degrees."
    turns = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"temp_c": 18}', "tool_name": "get_weather"}]
    assert whole(client, rt.name, turns, tools=[WEATHER]) == ("It is 18 degrees.", [])
    r = httpx.post(server.url + "/api/chat", headers=AUTH,          # the client reorders a tool's keys: raw
                   json={"model": rt.name, "messages": turns, "tools": [WEATHER], "stream": False})
    assert r.status_code == 200 and r.json()["message"]["content"] == "It is 18 degrees."
    ollama_prompt = rt.log[-1].request.prompt_ids
    openai_turns = ASK + [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_2_0", "type": "function",
                           "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                          {"role": "tool", "content": '{"temp_c": 18}', "name": "get_weather"}]
    r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH,
                   json={"model": rt.name, "messages": openai_turns, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    assert rt.log[-1].request.prompt_ids == ollama_prompt
    assert b"<tools>" in bytes(ollama_prompt) and b'{"temp_c": 18}' in bytes(ollama_prompt)


def test_show_says_the_model_takes_tools(fake):
    rt, _, client = fake
    assert client.show(rt.name).capabilities == ["completion", "tools"]


@pytest.mark.parametrize("kw, words", [
    (dict(tools=[WEATHER, WEATHER]), "more than once"),
    (dict(tools=[{"type": "function", "function": {"name": "no spaces"}}]), "tools"),
    (dict(messages=ASK + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}]),
     "arguments"),
    (dict(messages=ASK + [{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]), "name"),
], ids=["duplicate", "bad-name", "arguments-not-an-object", "call-without-name"])
def test_request_mistakes_are_400s(fake, kw, words):
    rt, server, _ = fake
    r = httpx.post(server.url + "/api/chat", headers=AUTH, json={"model": rt.name, "messages": ASK, **kw})
    assert r.status_code == 400 and words in r.json()["error"], r.text


def test_a_template_without_tools_is_a_400(fake):
    rt, server, client = fake
    rt.tokenizer.chat_template = None
    try:
        for kw in (dict(tools=[WEATHER]), dict(messages=ASK + [{"role": "tool", "content": "5"}])):
            with pytest.raises(ollama.ResponseError) as e:
                client.chat(**{"model": rt.name, "messages": ASK, **kw})
            assert e.value.status_code == 400 and "defines no tool calling" in e.value.error
    finally:
        rt.tokenizer.chat_template = HERMES_TEMPLATE


# ---------------------------------------------------------------- real: the 0.5B model

def each_way(client, url, model, messages, **kw):
    """The answer (content, calls, token texts) with speculation off, ngram and auto, streamed and whole:
    all six must be equal, and prompt lookup must have had drafts accepted (or it would prove nothing)."""
    answers = {}
    for spec in ("off", "ngram", "auto"):
        options = {"num_predict": 60, "speculative": spec}
        r = client.chat(model=model, messages=messages, options=options, logprobs=True, **kw)
        answers[spec, "whole"] = (r.message.content, calls_of(r.message), [p.token for p in r.logprobs])
        parts = list(client.chat(model=model, messages=messages, options=options, logprobs=True, stream=True, **kw))
        answers[spec, "streamed"] = ("".join(p.message.content or "" for p in parts),
                                     [c for p in parts for c in calls_of(p.message)],
                                     [t.token for p in parts for t in p.logprobs or []])
    assert len(set(map(repr, answers.values()))) == 1, answers
    sent = [m.model_dump(exclude_none=True) if isinstance(m, ollama.Message) else m for m in messages]
    body = {"model": model, "messages": sent, "stream": False,
            "options": {"num_predict": 60, "speculative": "ngram"}, **kw}
    ext = httpx.post(url + "/api/chat", json=body, timeout=600).json()
    assert ext["speczoo"]["accepted_draft_tokens"] > 0
    return answers["off", "whole"]


@pytest.mark.real
def test_the_ollama_tool_loop_on_the_real_model_is_lossless():
    rt = real_runtime(max_seq=1024)
    with BackgroundServer(create_app(rt, default_spec="auto")) as s:
        client = ollama.Client(host=s.url, timeout=600)
        content, calls, _ = each_way(client, s.url, rt.name, ASK, tools=[WEATHER])
        assert (content, calls) == ("", [("get_weather", {"city": "Paris"})])
        first = client.chat(model=rt.name, messages=ASK, tools=[WEATHER], options={"num_predict": 60})
        loop = ASK + [first.message, {"role": "tool", "tool_name": "get_weather",
                                      "content": json.dumps({"temp_c": 18, "sky": "sunny"})}]
        # The 0.5B model calls the tool again when it is still offered; without tools it answers.
        content, calls, _ = each_way(client, s.url, rt.name, loop)
        assert calls == [] and "18" in content
