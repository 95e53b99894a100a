"""The model's tool-call text read back as calls (serve/tool_calls.py): each format's calls, whole and
streamed in any chunking (a stream always adds up to the whole answer), and every wrong call kept as
content with an error instead of raising."""

from __future__ import annotations

import json

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from speczoo.serve.tool_calls import CallRules, ToolCallParser, finish_reason, parse_answer
from speczoo.serve.tool_formats import FORMATS, HERMES, LLAMA3_JSON

RULES = CallRules(names=frozenset({"get_weather", "add"}))


def hermes(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def llama(name: str, arguments: dict) -> str:
    return json.dumps({"name": name, "parameters": arguments})


def calls_of(answer) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in answer.calls]


def streamed(fmt, rules, pieces: list[str]):
    """(content, calls as (name, arguments), error) of an answer fed in `pieces`."""
    parser, content, calls = ToolCallParser(fmt, rules), "", []
    for delta in [parser.feed(p) for p in pieces] + [parser.finish()]:
        content += delta.content
        calls += [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in delta.calls]
    assert [c["index"] for c in parser.calls] == list(range(len(parser.calls)))
    return content or None if calls else content, calls, parser.answer_error()


# ---------------------------------------------------------------- Hermes (Qwen2.5, Qwen3)

def test_hermes_calls_with_text_before_them():
    text = "Let me look.\n" + hermes("get_weather", {"city": "Paris"}) + "\n" + hermes("add", {"a": 1, "b": 2})
    a = parse_answer(HERMES, RULES, text)
    assert a.content == "Let me look." and a.error is None
    assert calls_of(a) == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in a.calls)
    assert len({c["id"] for c in a.calls}) == 2


def test_an_answer_of_calls_only_has_no_content():
    a = parse_answer(HERMES, RULES, "\n" + hermes("add", {"a": 1}) + "\n")
    assert a.content is None and calls_of(a) == [("add", {"a": 1})]


def test_a_call_in_a_json_code_fence_is_read_and_other_fenced_json_is_text():
    fenced = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Oslo"}\n}\n```'
    assert calls_of(parse_answer(HERMES, RULES, fenced)) == [("get_weather", {"city": "Oslo"})]
    text = 'Here:\n```json\n{"city": "Oslo"}\n```\nDone.'
    a = parse_answer(HERMES, RULES, text)
    assert a.content == text and a.calls == [] and a.error is None


def test_a_bare_json_call_opening_the_answer_is_read_and_later_json_is_text():
    a = parse_answer(HERMES, RULES, '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert a.content is None and calls_of(a) == [("get_weather", {"city": "Paris"})]
    text = 'Call it so: {"name": "add", "arguments": {"a": 1}}'
    assert parse_answer(HERMES, RULES, text).content == text


def test_a_call_the_model_did_not_close_is_taken_when_its_json_is_complete():
    a = parse_answer(HERMES, RULES, '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n')
    assert calls_of(a) == [("add", {"a": 1})] and a.error is None


def test_arguments_written_as_a_json_string_are_read_as_the_object():
    a = parse_answer(HERMES, RULES, '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert calls_of(a) == [("add", {"a": 1})]


@pytest.mark.parametrize("text, why", [
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'with a "name"'),
    ('<tool_call>["add"]</tool_call>', 'with a "name"'),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "'rm_rf', which is not among the tools"),
    ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "not a JSON object"),
    ('Sure. <tool_call>{"name": "add", "arguments": {"a": 1', "not complete JSON"),
])
def test_a_wrong_call_is_kept_as_content_with_an_error(text, why):
    a = parse_answer(HERMES, RULES, text)
    assert a.calls == [] and a.content == text and why in a.error
    assert finish_reason("stop", bool(a.calls)) == "stop"


def test_a_wrong_call_beside_a_right_one_keeps_the_right_one():
    text = hermes("add", {"a": 1}) + "\n<tool_call>{oops}</tool_call>"
    a = parse_answer(HERMES, RULES, text)
    assert calls_of(a) == [("add", {"a": 1})] and a.content == "\n<tool_call>{oops}</tool_call>"
    assert "not valid JSON" in a.error and finish_reason("stop", True) == "tool_calls"


def test_tool_choice_rules():
    named = CallRules(names=RULES.names, named="add", required=True)
    a = parse_answer(HERMES, named, hermes("get_weather", {"city": "Rome"}))
    assert a.calls == [] and "tool_choice names 'add'" in a.error
    required = CallRules(names=RULES.names, required=True)
    a = parse_answer(HERMES, required, "I won't.")
    assert a.content == "I won't." and "answered without one" in a.error
    single = CallRules(names=RULES.names, parallel=False)
    a = parse_answer(HERMES, single, hermes("add", {"a": 1}) + hermes("add", {"a": 2}))
    assert calls_of(a) == [("add", {"a": 1})] and "parallel_tool_calls is false" in a.error


def test_finish_reason():
    assert finish_reason("stop", True) == "tool_calls"
    assert finish_reason("stop", False) == "stop"
    assert finish_reason("length", True) == "length"


# ---------------------------------------------------------------- Llama 3.1 / 3.2 JSON

def test_llama_json_calls_bare_separated_and_after_the_python_tag():
    a = parse_answer(LLAMA3_JSON, RULES, llama("add", {"a": 2}) + "; " + llama("get_weather", {"city": "Lima"}))
    assert a.content is None and calls_of(a) == [("add", {"a": 2}), ("get_weather", {"city": "Lima"})]
    a = parse_answer(LLAMA3_JSON, RULES, "<|python_tag|>" + llama("add", {"a": 3}))
    assert calls_of(a) == [("add", {"a": 3})]
    a = parse_answer(LLAMA3_JSON, RULES, '{"name": "add", "arguments": {"a": 4}}')
    assert calls_of(a) == [("add", {"a": 4})]


@pytest.mark.parametrize("text", [
    '{"name": "Ada", "born": 1815}',                       # JSON, but not shaped like a call
    "The answer is " + llama("add", {"a": 1}),              # a call only opens the answer
    '{"broken": ',                                          # JSON that never completes
    "[1, 2, 3]",
])
def test_llama_json_that_is_not_a_call_is_plain_content(text):
    a = parse_answer(LLAMA3_JSON, RULES, text)
    assert a.content == text and a.calls == [] and a.error is None


def test_llama_unknown_function_is_an_error():
    text = llama("rm_rf", {})
    a = parse_answer(LLAMA3_JSON, RULES, text)
    assert a.content == text and "not among the tools" in a.error


# ---------------------------------------------------------------- streaming adds up to the whole answer

def test_content_streams_as_it_comes_and_a_call_shows_only_when_complete():
    parser = ToolCallParser(HERMES, RULES)
    assert parser.feed("Checking").content == "Checking"
    assert parser.feed(" now.\n<tool").content == " now."          # "<tool" may open a call: held
    d = parser.feed('_call>\n{"name": "add", ')
    assert d.content == "" and d.calls == []
    d = parser.feed('"arguments": {"a": 1}}\n</tool_call>')
    assert d.content == "" and [c["function"]["name"] for c in d.calls] == ["add"]
    end = parser.finish()
    assert end.content == "" and end.calls == [] and parser.answer_error() is None


SEGMENTS = st.one_of(
    st.text(alphabet=st.sampled_from("ab {}<>_`:;\n\"é"), max_size=12),
    st.builds(hermes, st.sampled_from(["add", "get_weather", "nope"]),
              st.dictionaries(st.sampled_from("xyz"), st.integers(-3, 3), max_size=2)),
    st.builds(llama, st.sampled_from(["add", "nope"]), st.dictionaries(st.sampled_from("xy"), st.booleans())),
    st.sampled_from(["<tool_call>", "</tool_call>", "<|python_tag|>", "```json\n", "\n```", "<tool_call>{bad}"]),
)


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@settings(max_examples=400, deadline=None)
@given(segments=st.lists(SEGMENTS, max_size=5), cuts=st.lists(st.integers(0, 10_000), max_size=12),
       fmt=st.sampled_from(FORMATS), parallel=st.booleans())
def test_any_chunking_of_the_stream_adds_up_to_the_whole_answer(segments, cuts, fmt, parallel):
    rules = CallRules(names=RULES.names, parallel=parallel)
    text = "".join(segments)
    whole = parse_answer(fmt, rules, text)
    assert streamed(fmt, rules, chunked(text, cuts)) == (whole.content, calls_of(whole), whole.error)
    assert streamed(fmt, rules, list(text)) == (whole.content, calls_of(whole), whole.error)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_characters="<`{"), max_size=40),
       fmt=st.sampled_from(FORMATS))
def test_an_answer_without_call_markup_is_its_text_exactly(text, fmt):
    a = parse_answer(fmt, RULES, text)
    assert a.content == text and a.calls == [] and a.error is None
