"""The grammar of a forced tool call (serve/tool_grammar.py): none unless tool_choice forces a call; the
named function or any of the tools, its arguments as its parameters schema; a marker the vocabulary holds
as one token written as that token; a schema llguidance refuses a 400 naming `tools`. On the real Qwen
tokenizer, the template's own call text is accepted and then only the end of the turn, and arguments
outside the schema are not."""

from __future__ import annotations

import pytest
from real_models import QWEN_NAME

from speczoo.grammar import Grammars
from speczoo.serve.api_errors import APIError
from speczoo.serve.schemas import ChatCompletionRequest
from speczoo.serve.structured import INVALID_SCHEMA
from speczoo.serve.tool_grammar import call_constraint
from speczoo.serve.tool_prompt import plan_tools
from speczoo.tokenizer import Tokenizer
from speczoo.zoo.bundle import find_bundle

HERMES_STYLE = "{% if tools %}<tool_call>{% endif %}"
LLAMA_STYLE = "<|start_header_id|>{% if tools %}tool_call{% endif %}"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add"}}
NAMED_ADD = {"type": "function", "function": {"name": "add"}}    # tool_choice naming `add`


def byte_level(text: str) -> list[int]:
    return list(text.encode())


def plan_of(template=HERMES_STYLE, **kw):
    return plan_tools(ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **kw), template)


def test_only_a_forced_call_has_a_grammar():
    assert call_constraint(plan_of(tools=[WEATHER]), byte_level) is None


def test_required_offers_every_tool_and_named_only_its_function():
    required = call_constraint(plan_of(tools=[WEATHER, ADD], tool_choice="required"), byte_level)
    assert required.kind == "lark" and required.source.startswith('start: " " body "}" "\\n" "</tool_call>" more*')
    assert '"\\"get_weather\\""' in required.source and '"\\"add\\""' in required.source
    named = call_constraint(plan_of(tools=[WEATHER, ADD], tool_choice=NAMED_ADD), byte_level)
    assert named.source.startswith('start: " " args0') and "get_weather" not in named.source
    single = call_constraint(plan_of(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False), byte_level)
    assert "more" not in single.source


def test_a_marker_the_vocabulary_holds_as_one_token_is_that_token():
    def qwen_like(text: str) -> list[int]:
        return {"<tool_call>": [7], "</tool_call>": [8]}.get(text) or byte_level(text)
    source = call_constraint(plan_of(tools=[WEATHER], tool_choice="required"), qwen_like).source
    assert '"\\n" <[8]>' in source and 'more: "\\n" <[7]>' in source


def test_a_format_without_a_closing_marker_is_one_call_with_its_arguments_key():
    source = call_constraint(plan_of(LLAMA_STYLE, tools=[WEATHER], tool_choice="required"), byte_level).source
    assert source.startswith('start: " " body "}" "\\n"?\n') and '"parameters' in source and "more" not in source


def test_a_schema_llguidance_refuses_is_a_400_naming_tools():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    with pytest.raises(APIError) as err:
        call_constraint(plan_of(tools=[bad], tool_choice="required"), byte_level)
    assert err.value.status == 400 and err.value.code == INVALID_SCHEMA and err.value.param == "tools"


@pytest.mark.real
def test_on_qwens_tokenizer_the_templates_call_is_accepted_and_wrong_arguments_are_not():
    tok = Tokenizer.from_bundle(find_bundle(QWEN_NAME))
    grammars = Grammars(tok, 151936)
    plan = plan_tools(ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                            tools=[WEATHER, ADD], tool_choice="required"), tok.chat_template)
    constraint = call_constraint(plan, tok.encode)

    def accepts(text: str) -> bool:
        g = grammars(constraint)
        for i in tok.encode(text):
            if not g.allowed()[i]:
                return False
            g.consume(i)
        allowed = g.allowed()
        return all(allowed[e] for e in tok.eos_ids)        # the turn may end here
    assert accepts(' "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert accepts(' "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
                   '{"name": "add", "arguments": {"a": 1}}\n</tool_call>')
    assert not accepts(' "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>')
    assert not accepts(' "rm", "arguments": {}}\n</tool_call>')
