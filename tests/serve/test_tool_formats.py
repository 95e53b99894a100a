"""Which tool-call format a chat template speaks (serve/tool_formats.py): from each zoo model's own
template, speczoo's builtin ones, and Llama 3.1-style and unknown tool templates; and the start of a
call that tool_choice required / named writes after the generation prompt."""

from __future__ import annotations

import json

import pytest
from real_models import GEMMA_NAME, QWEN_NAME, SMOLLM_NAME

from speczoo.serve.tool_calls import CallRules, ToolCallParser
from speczoo.serve.tool_formats import HERMES, LLAMA3_JSON, UnknownToolFormat, detect_format
from speczoo.tokenizer import BUILTIN_CHAT_TEMPLATES, Tokenizer
from speczoo.zoo.bundle import find_bundle

# A Llama 3.1-style template written for this test (tools in the first user turn, calls as JSON with
# "parameters", results in "ipython" turns), as Meta's own renders them.
LLAMA31_STYLE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% for tool_call in m.tool_calls %}{{ '{\"name\": \"' + tool_call.function.name + '\", \"parameters\": ' }}"
    "{{ tool_call.function.arguments | tojson }}}{% endfor %}<|eot_id|>"
    "{% elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if tools and loop.first %}Functions:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


@pytest.mark.real
@pytest.mark.parametrize("name, fmt", [(QWEN_NAME, HERMES), (GEMMA_NAME, None), (SMOLLM_NAME, None)])
def test_each_zoo_models_own_template(name, fmt):
    assert detect_format(Tokenizer.from_bundle(find_bundle(name)).chat_template) is fmt


@pytest.mark.parametrize("name", sorted(BUILTIN_CHAT_TEMPLATES))
def test_speczoos_builtin_templates_define_no_tools(name):
    assert detect_format(BUILTIN_CHAT_TEMPLATES[name]) is None


def test_other_templates():
    assert detect_format(None) is None
    assert detect_format(LLAMA31_STYLE) is LLAMA3_JSON
    assert detect_format("{% if tools %}<tool_call>{% endif %}") is HERMES
    with pytest.raises(UnknownToolFormat, match="cannot parse yet.*hermes.*llama3_json"):
        detect_format("{% for t in tools %}[TOOL_CALLS]{{ t | tojson }}{% endfor %}")


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3_JSON])
def test_a_prefill_opens_a_call_that_the_models_continuation_completes(fmt):
    """What tool_choice required / named writes after the generation prompt: it ends on a token boundary
    (no trailing space or newline), and the rest the model writes completes the call."""
    rules = CallRules(names=frozenset({"add"}), named="add", required=True)
    for name, rest in ((None, ' "add", "%s": {"a": 1}}' % fmt.arguments_key), ("add", ' {"a": 1}}')):
        call_start = fmt.call_start(name)
        assert call_start == call_start.rstrip()
        parser = ToolCallParser(fmt, rules)
        assert parser.feed(call_start).content == ""
        calls = parser.feed(rest + ("\n</tool_call>" if fmt is HERMES else "")).calls + parser.finish().calls
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("add", {"a": 1})]
