"""Tool calls through a real uvicorn server and the official `openai` client (and one agent framework,
smolagents): the call → tool result → answer loop, streaming and not.

Fast tests script the answer on the fake runtime (a call, a wrong call, a template without tools) and
stream it one byte per round, so the deltas' shapes and the 400s are checked in milliseconds. The
`real` tests run the loop on the pulled qwen2.5-coder-0.5b, and prove speculation stays lossless: the
same tool-call turn with `speculative: off`, `ngram` and `auto`, streamed and not, gives the same message.
"""

from __future__ import annotations

import json

import openai
import pytest
from real_models import real_runtime

from openai_chat import KEY
from tool_chat import ASK, CALL, HERMES_TEMPLATE, WEATHER, fake_tool_server
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer
from speczoo.serve.tool_prompt import MISMATCH



def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=600)


def whole(client, model, messages, **kw):
    """(content, [(name, arguments)], finish_reason, tool_call_error) of a non-streamed answer."""
    r = client.chat.completions.create(model=model, messages=messages, **kw)
    c = r.choices[0]
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or []]
    assert all(t.id.startswith("call_") and t.type == "function" for t in c.message.tool_calls or [])
    return c.message.content, calls, c.finish_reason, (c.model_extra or {}).get("tool_call_error")


def streamed(client, model, messages, **kw):
    """The same four of a streamed answer, put together from its deltas as a client does."""
    content, calls, finish, error = "", {}, None, None
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            assert d.id.startswith("call_") and d.type == "function" and d.index not in calls
            calls[d.index] = (d.function.name, json.loads(d.function.arguments))
        finish = choice.finish_reason or finish
        error = (choice.model_extra or {}).get("tool_call_error") or error
    return content or None if calls else content, [calls[i] for i in sorted(calls)], finish, error


# ---------------------------------------------------------------- fast: scripted answers on the fake

@pytest.fixture(scope="module", params=[1, 4], ids=["one-at-a-time", "parallel-4"])
def fake(request):
    with fake_tool_server(request.param) as (rt, server):
        yield rt, client_of(server)


@pytest.mark.parametrize("answer, expected", [
    ("Looking.\n" + CALL, ("Looking.", [("get_weather", {"city": "Paris"})], "tool_calls", None)),
    (CALL + CALL, (None, [("get_weather", {"city": "Paris"})] * 2, "tool_calls", None)),
    ("<tool_call>{city: Paris}</tool_call>", ("<tool_call>{city: Paris}</tool_call>", [], "stop", "not valid JSON")),
    ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
     ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', [], "stop", "'rm', which is not among the tools")),
    ("It is sunny.", ("It is sunny.", [], "stop", None)),
], ids=["call", "two-calls", "bad-json", "unknown-function", "no-call"])
def test_a_scripted_answer_whole_and_streamed_byte_by_byte(fake, answer, expected):
    rt, client = fake
    rt.answer_text = answer
    got = whole(client, rt.name, ASK, tools=[WEATHER])
    assert got[:3] == expected[:3] and (expected[3] is None) == (got[3] is None)
    assert expected[3] is None or expected[3] in got[3]
    assert streamed(client, rt.name, ASK, tools=[WEATHER]) == got


def test_tool_choice_none_shows_no_tools_and_reads_no_calls(fake):
    rt, client = fake
    rt.answer_text = CALL
    assert whole(client, rt.name, ASK, tools=[WEATHER], tool_choice="none") == (CALL, [], "stop", None)
    assert b"<tools>" not in bytes(rt.log[-1].request.prompt_ids)


def test_required_and_named_start_the_answer_inside_a_call(fake):
    rt, client = fake
    rt.answer_text = ' "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert whole(client, rt.name, ASK, tools=[WEATHER], tool_choice="required")[1:3] == (
        [("get_weather", {"city": "Oslo"})], "tool_calls")
    assert bytes(rt.log[-1].request.prompt_ids).decode().endswith('assistant\n<tool_call>\n{"name":')
    grammar = rt.log[-1].request.constraint        # the rest of the call is decoded inside its grammar
    assert grammar.kind == "lark" and '"\\"get_weather\\""' in grammar.source and '"city"' in grammar.source
    rt.answer_text = ' {"city": "Rome"}}\n</tool_call>'
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert streamed(client, rt.name, ASK, tools=[WEATHER], tool_choice=named)[1:3] == (
        [("get_weather", {"city": "Rome"})], "tool_calls")


def test_a_template_without_tools_is_a_400(fake):
    rt, client = fake
    rt.tokenizer.chat_template = None
    try:
        with pytest.raises(openai.BadRequestError, match="defines no tool calling"):
            whole(client, rt.name, ASK, tools=[WEATHER])
    finally:
        rt.tokenizer.chat_template = HERMES_TEMPLATE


def test_request_mistakes_are_400s(fake):
    rt, client = fake
    cases = [
        (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}), "response_format"),
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "not among the tools"),
        (dict(tool_choice="required"), "no tools"),
    ]
    for kw, words in cases:
        with pytest.raises(openai.BadRequestError, match=words) as e:
            whole(client, rt.name, kw.pop("messages", ASK), **kw)
        assert e.value.code == MISMATCH        # a rule of the schema's fields that the schema cannot state


# ---------------------------------------------------------------- real: the 0.5B model

@pytest.fixture(scope="module")
def real():
    rt = real_runtime(max_seq=2048)      # smolagents' system prompt alone is ~1,100 tokens
    with BackgroundServer(create_app(rt, api_key=KEY)) as server:
        yield rt, server


def each_way(client, model, messages, **kw):
    """The answer with speculation off and on (ngram, auto), whole and streamed: all six must be equal,
    and prompt lookup must have had drafts accepted (or the equality would prove nothing)."""
    answers = {(spec, how.__name__): how(client, model, messages, extra_body={"speculative": spec}, max_tokens=60, **kw)
               for spec in ("off", "ngram", "auto") for how in (whole, streamed)}
    assert len(set(map(repr, answers.values()))) == 1, answers
    r = client.chat.completions.create(model=model, messages=messages, extra_body={"speculative": "ngram"},
                                       max_tokens=60, **kw)
    assert r.usage.accepted_draft_tokens > 0
    return answers["off", "whole"]


@pytest.mark.real
def test_the_openai_tool_loop_on_the_real_model_is_lossless(real):
    rt, server = real
    client = client_of(server)
    content, calls, finish, error = each_way(client, rt.name, ASK, tools=[WEATHER])
    assert (content, calls, finish, error) == (None, [("get_weather", {"city": "Paris"})], "tool_calls", None)
    first = client.chat.completions.create(model=rt.name, messages=ASK, tools=[WEATHER], max_tokens=60)
    call = first.choices[0].message.tool_calls[0]
    loop = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18, "sky": "sunny"})}]
    # The 0.5B model calls the tool again when it is still offered; tool_choice "none" asks for the answer.
    content, calls, finish, error = each_way(client, rt.name, loop, tools=[WEATHER], tool_choice="none")
    assert finish == "stop" and calls == [] and error is None and "18" in content


@pytest.mark.real
def test_tool_choice_on_the_real_model(real):
    rt, server = real
    client = client_of(server)
    small_talk = [{"role": "user", "content": "How warm is it in Oslo today?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        assert whole(client, rt.name, small_talk, tools=[WEATHER], tool_choice=choice, max_tokens=40)[1:] == (
            [("get_weather", {"city": "Oslo"})], "tool_calls", None)
    content, calls, finish, _ = whole(client, rt.name, small_talk, tools=[WEATHER], tool_choice="none", max_tokens=40)
    assert calls == [] and finish in ("stop", "length") and content


FORECAST = {"type": "function", "function": {
    "name": "get_forecast", "description": "The weather forecast for a city, some days ahead",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}


@pytest.mark.real
def test_a_forced_call_is_decoded_inside_its_grammar_and_stays_lossless(real):
    """tool_choice required / named: the call's arguments match the function's schema (llguidance), and
    every speculative mode gives constrained greedy's tokens."""
    rt, server = real
    client = client_of(server)
    ask = [{"role": "user", "content": "Will it rain in Oslo this week?"}]
    named = {"type": "function", "function": {"name": "get_forecast"}}
    accepted: dict[str, int] = {}
    for choice in ("required", named):
        answers = {}
        for spec in ("off", "ngram", "auto"):
            r = client.chat.completions.create(model=rt.name, messages=ask, tools=[WEATHER, FORECAST], tool_choice=choice,
                                               max_tokens=60, logprobs=True, extra_body={"speculative": spec})
            c = r.choices[0]
            answers[spec] = ([(t.token, t.bytes) for t in c.logprobs.content], c.finish_reason,
                             [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or []])
            accepted[spec] = accepted.get(spec, 0) + r.usage.accepted_draft_tokens
        assert answers["ngram"] == answers["off"] and answers["auto"] == answers["off"], answers
        _, finish, calls = answers["off"]
        assert finish == "tool_calls" and calls, answers["off"]
        for name, args in calls:
            assert name in ("get_weather", "get_forecast") and isinstance(args["city"], str)
            if name == "get_forecast":
                assert set(args) == {"city", "days"} and isinstance(args["days"], int) and 1 <= args["days"] <= 7
        assert choice == "required" or {name for name, _ in calls} == {"get_forecast"}
    assert accepted["ngram"] > 0, accepted          # prompt lookup drafted inside the grammar (or nothing is proved)


@pytest.mark.real
def test_a_smolagents_tool_calling_agent_gets_its_calls_from_the_server(real):
    """smolagents' ToolCallingAgent (tool_choice "required" with its own final_answer tool) on the 0.5B:
    its first step is a parsed call to one of its tools. What the call says is the small model's business."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: the city's name
        """
        return json.dumps({"city": city, "temp_c": 18, "sky": "sunny"})

    rt, server = real
    model = OpenAIServerModel(model_id=rt.name, api_base=server.url + "/v1", api_key=KEY, max_tokens=40,
                              temperature=0)
    agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=1, verbosity_level=0)
    agent.run("What is the weather in Paris?")
    step = agent.memory.steps[1]
    message = step.model_output_message.raw.choices[0]
    assert message.finish_reason == "tool_calls"
    assert [c.function.name for c in message.message.tool_calls] == ["get_weather"]
