"""A chat request's tools turned into what the model's own template renders (serve/tool_prompt.py): the
messages as OpenAI's dicts with the arguments as objects, rendered for each zoo model as transformers
renders them; tool_choice's plan; and every request mistake a 400 that says what is wrong."""

from __future__ import annotations

import json

import pytest
from real_models import GEMMA_NAME, QWEN_NAME, SMOLLM_NAME

from speczoo.chat import render_chat_prompt
from speczoo.serve.api_errors import APIError
from speczoo.serve.schemas import ChatCompletionRequest
from speczoo.serve.tool_formats import HERMES
from speczoo.serve.tool_prompt import MISMATCH, UNSUPPORTED, plan_tools, template_messages
from speczoo.tokenizer import Tokenizer
from speczoo.zoo.bundle import find_bundle

HERMES_STYLE = "{% if tools %}<tool_call>{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
LOOP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and 2+3?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "5"},
]


def request(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(**{"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


def test_messages_are_openais_dicts_with_the_arguments_as_objects():
    msgs = template_messages(request(messages=LOOP).messages)
    assert msgs[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}
    assert msgs[3] == {"role": "tool", "content": '{"temp_c": 18}', "tool_call_id": "call_1"}


def test_what_the_client_sent_is_passed_on_as_it_is():
    """A tool result without its call's id, arguments that are not JSON: the template gets them as sent."""
    msgs = template_messages(request(messages=[
        {"role": "tool", "content": "5"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "add", "arguments": "{a: 1"}}]}]).messages)
    assert msgs[0] == {"role": "tool", "content": "5"}
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == "{a: 1"


def test_the_plan_of_each_tool_choice():
    assert plan_tools(request(), HERMES_STYLE) is None
    assert plan_tools(request(tools=[WEATHER], tool_choice="none"), HERMES_STYLE) is None
    auto = plan_tools(request(tools=[WEATHER, ADD]), HERMES_STYLE)
    assert auto.fmt is HERMES and auto.call_start == "" and not auto.rules.required
    assert auto.rules.names == {"get_weather", "add"} and auto.rules.parallel
    assert auto.tools == [WEATHER, ADD]
    required = plan_tools(request(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False), HERMES_STYLE)
    assert required.rules.required and required.call_start == HERMES.call_start(None) and not required.rules.parallel
    named = plan_tools(request(tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}}),
                       HERMES_STYLE)
    assert named.rules.named == "add" and named.call_start == HERMES.call_start("add")


@pytest.mark.parametrize("kw, template, words, code", [
    (dict(tool_choice="required"), HERMES_STYLE, "no tools", MISMATCH),
    (dict(tools=[WEATHER]), "{{ messages }}", "defines no tool calling", UNSUPPORTED),
    (dict(messages=LOOP), "{{ messages }}", "defines no tool calling, so it cannot take a conversation", UNSUPPORTED),
    (dict(tools=[WEATHER]), "{{ tools }}[TOOL_CALLS]", "cannot parse yet", UNSUPPORTED),
    (dict(tools=[WEATHER, WEATHER]), HERMES_STYLE, "more than once", MISMATCH),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "add"}}), HERMES_STYLE,
     "not among the tools", MISMATCH),
])
def test_a_request_mistake_is_a_400_saying_what_is_wrong(kw, template, words, code):
    with pytest.raises(APIError, match=words) as err:
        plan_tools(request(**kw), template)
    assert err.value.status == 400 and err.value.code == code


def test_the_schema_rejects_a_bad_function_name_and_an_unknown_tool_choice():
    with pytest.raises(ValueError):
        request(tools=[{"type": "function", "function": {"name": "no spaces allowed"}}])
    with pytest.raises(ValueError):
        request(tools=[WEATHER], tool_choice="always")


# ---------------------------------------------------------------- each zoo model's own template

def _zoo_template(name: str) -> Tokenizer:
    return Tokenizer.from_bundle(find_bundle(name))


@pytest.mark.real
def test_qwen_renders_tools_calls_and_results_as_transformers_does():
    from transformers.utils.chat_template_utils import render_jinja_template

    tok = _zoo_template(QWEN_NAME)
    plan = plan_tools(request(messages=LOOP, tools=[WEATHER, ADD]), tok.chat_template)
    msgs = template_messages(request(messages=LOOP).messages)
    ours = render_chat_prompt(tok, msgs, tools=plan.tools)
    theirs, _ = render_jinja_template([msgs], tools=plan.tools, chat_template=tok.chat_template,
                                      add_generation_prompt=True)
    assert ours == theirs[0]
    assert json.dumps(WEATHER, ensure_ascii=False) in ours                    # the tools, in <tools>
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in ours
    assert '<|im_start|>user\n<tool_response>\n{"temp_c": 18}\n</tool_response>\n<tool_response>\n5\n' in ours
    assert ours.endswith("<|im_start|>assistant\n")


@pytest.mark.real
@pytest.mark.parametrize("name", [GEMMA_NAME, SMOLLM_NAME])
def test_a_zoo_model_whose_template_defines_no_tools_answers_400(name):
    template = _zoo_template(name).chat_template
    for kw in (dict(tools=[WEATHER]), dict(messages=LOOP)):
        with pytest.raises(APIError, match="defines no tool calling") as err:
            plan_tools(request(**kw), template)
        assert err.value.status == 400
    assert plan_tools(request(tools=[WEATHER], tool_choice="none"), template) is None   # not shown: fine
