"""The agentic traces: built from the standard library's files, deterministic, Spec-Bench-valid, and
rendered by the suite with their system message, tools and tool results."""

import json

import pytest

from fake_runtime import FakeTokenizer
from question_files import write_questions
from speczoo.bench import agentic
from speczoo.bench.questions import QuestionFileError, parse_lines, read_questions
from speczoo.bench.suite import prompt_sha256, turn_messages


@pytest.fixture(scope="module")
def traces():
    return agentic.agentic_questions()


def test_the_traces_are_deterministic_and_spec_bench_valid(traces, tmp_path):
    assert [(q.question_id, q.category, q.turns, q.extra) for q in agentic.agentic_questions()] == \
        [(q.question_id, q.category, q.turns, q.extra) for q in traces]
    assert [q.category for q in traces] == [c for c in agentic.CATEGORIES for _ in range(3)]
    assert [q.question_id for q in traces] == list(range(agentic.FIRST_ID, agentic.FIRST_ID + 9))
    path = tmp_path / "agentic.jsonl"
    write_questions(path, traces)
    back = read_questions(path)                 # a Spec-Bench file the suite reads back unchanged
    assert [(q.question_id, q.category, q.turns, q.extra) for q in back] == \
        [(q.question_id, q.category, q.turns, q.extra) for q in traces]
    assert len({prompt_sha256(q) for q in traces}) == len(traces)
    assert all(len(q.turns) >= 3 for q in traces)


def test_every_edit_turn_resends_the_file_with_the_earlier_edits_applied(traces):
    root = agentic.stdlib_root()
    for q in traces[:3]:
        [path] = q.extra["source"]
        snippet = next(s for s in agentic.find_snippets(root, 3) if s.path == path)
        assert snippet.code in (root / path).read_text(encoding="utf-8")     # a real function, verbatim
        codes = [turn.split("```python\n")[1].split("\n```")[0] for turn in q.turns]
        assert codes[0] == snippet.code
        assert codes[1] == agentic.rename(snippet.code, snippet.arg, snippet.arg + "_in")
        assert agentic.COMMENT in codes[2] and agentic.COMMENT not in codes[1]
        assert f"def {snippet.name}_v2(" in codes[3]
        assert all(agentic.EDIT_ASK in turn for turn in q.turns)


def test_rename_touches_names_only():
    code = 'def wrap(text):\n    """Wrap text."""\n    return w.wrap(text)  # text\n'
    assert agentic.rename(code, "text", "t2") == 'def wrap(t2):\n    """Wrap text."""\n    return w.wrap(t2)  # text\n'
    assert agentic.rename(code, "wrap", "wrap_v2").startswith("def wrap_v2(text)")
    assert "w.wrap(" in agentic.rename(code, "wrap", "wrap_v2")


def test_tool_traces_carry_real_tool_results_and_tools(traces):
    root = agentic.stdlib_root()
    quote, tools = traces[3], traces[6]
    grep_out = quote.extra["tool_results"][0]
    for line in grep_out.splitlines():
        path, lineno, text = line.split(":", 2)
        assert (root / path).read_text(encoding="utf-8").splitlines()[int(lineno) - 1] == text
    assert tools.extra["tools"] == agentic.TOOLS and tools.extra["system"] == agentic.SYSTEM_TOOLS
    assert tools.extra["tool_results"][0] is None and all(tools.extra["tool_results"][1:])


def test_the_suite_renders_system_tools_and_tool_results(traces):
    q = traces[6]
    messages = turn_messages(q, ["call 1", "call 2"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user", "assistant",
                                             "tool", "user"]
    assert messages[3]["content"] == q.extra["tool_results"][1] and messages[5]["content"] == "call 2"
    text = FakeTokenizer().apply_chat_template(messages, tools=q.extra["tools"])
    assert json.dumps(agentic.TOOLS) in text


def test_a_question_file_with_bad_conversation_keys_is_refused():
    good = {"question_id": 1, "category": "c", "turns": ["a", "b"], "tool_results": [None, "x"]}
    assert parse_lines([json.dumps(good)], "f")[0].extra["tool_results"] == [None, "x"]
    for bad, msg in (({"tool_results": ["x"]}, "one string or null per turn"),
                     ({"tools": "read_file"}, "tools must be a list"), ({"system": 3}, "system must be")):
        with pytest.raises(QuestionFileError, match=msg):
            parse_lines([json.dumps({**good, **bad})], "f")


def test_a_python_without_sources_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="standard library"):
        agentic.agentic_questions(root=tmp_path)
    with pytest.raises(ValueError):
        agentic.agentic_questions(per_category=0)
