"""Spec-Bench question files: round trip, errors with line numbers, selection, the built-in set."""

import json

import pytest

from question_files import question_row, write_questions
from speczoo.bench.questions import (
    CATEGORIES, Question, QuestionFileError, builtin_questions, categories_of, load_questions,
    read_questions, select)


def test_round_trip_with_multi_turn_extra_keys_and_unicode(tmp_path):
    qs = [Question(1, "rag", ["Quote the line."]),
          Question(2, "multi_turn", ["first turn", "second turn", "third — ü"]),
          Question(7, "my_own_category", ["x"], extra={"reference": ["y"]})]
    path = tmp_path / "q.jsonl"
    write_questions(path, qs)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[1]) == {"question_id": 2, "category": "multi_turn",
                                    "turns": ["first turn", "second turn", "third — ü"]}
    back = read_questions(path)
    assert back == qs
    assert back[2].category == "my_own_category"           # unknown category kept as given
    assert question_row(back[2])["reference"] == ["y"]


@pytest.mark.parametrize("line, needle", [
    ('{"question_id": 3, "category": "rag", "turns": ["a"]', "not valid JSON"),
    ('{"question_id": "3", "category": "rag", "turns": ["a"]}', "question_id must be an integer"),
    ('{"question_id": 3, "category": "rag"}', "missing key(s) turns"),
    ('{"question_id": 3, "category": "rag", "turns": []}', "turns must be"),
    ('{"question_id": 3, "category": "", "turns": ["a"]}', "category must be"),
    ('[1, 2]', "expected a JSON object"),
    ('{"question_id": 1, "category": "rag", "turns": ["dup"]}', "already used on line 1"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question_id": 1, "category": "rag", "turns": ["a"]}\n\n' + line + "\n")
    with pytest.raises(QuestionFileError) as err:
        read_questions(path)
    assert f"{path}:3" in str(err.value) and needle in str(err.value)


def test_empty_file_is_a_clear_error(tmp_path):
    for content in ("", "\n  \n"):
        path = tmp_path / "empty.jsonl"
        path.write_text(content)
        with pytest.raises(QuestionFileError, match="no questions in the file"):
            read_questions(path)
    with pytest.raises(FileNotFoundError):
        read_questions(tmp_path / "missing.jsonl")


def test_select_by_category_and_limit():
    qs = [Question(i, cat, ["t"]) for i, cat in enumerate(["a", "b", "a", "c", "a", "b"])]
    assert [q.question_id for q in select(qs, ["a", "b"])] == [0, 1, 2, 4, 5]
    assert [q.question_id for q in select(qs, limit=1)] == [0, 1, 3]
    assert [q.question_id for q in select(qs, ["a"], limit=2)] == [0, 2]
    with pytest.raises(ValueError, match="no question has category zzz"):
        select(qs, ["zzz"])
    with pytest.raises(ValueError):
        select(qs, limit=0)
    assert categories_of(qs) == ["a", "b", "c"]


def test_builtin_set_covers_every_category():
    qs = builtin_questions()
    assert load_questions("builtin") == qs and load_questions(None) == qs
    assert len(qs) >= 72
    counts = {c: sum(q.category == c for q in qs) for c in CATEGORIES}
    assert all(n >= 8 for n in counts.values()), counts
    assert categories_of(qs) == list(CATEGORIES)
    assert all(len(q.turns) in (2, 3) for q in qs if q.category == "multi_turn")
    assert all(len(q.turns) == 1 for q in qs if q.category != "multi_turn")
    assert len({q.turns[0] for q in qs}) == len(qs)     # no duplicated prompts


def test_builtin_code_edit_functions_are_40_to_80_lines():
    for q in builtin_questions():
        if q.category != "code_edit":
            continue
        code = q.turns[0].split("```python\n", 1)[1].split("```", 1)[0]
        n = len(code.strip("\n").splitlines())
        assert 40 <= n <= 80, (q.question_id, n)
        compile(code, f"q{q.question_id}", "exec")            # the code given is valid Python


def test_builtin_prompt_sizes_are_reasonable():
    # ~150-900 target tokens; about 4 characters a token for English and code.
    for q in builtin_questions():
        chars = sum(len(t) for t in q.turns)
        assert 150 <= chars <= 4800, (q.question_id, q.category, chars)
