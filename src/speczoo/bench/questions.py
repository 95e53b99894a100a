"""Benchmark questions in Spec-Bench's JSON-lines format, and the built-in question set.

One line per question: ``{"question_id": int, "category": str, "turns": [str, ...]}``. Extra keys on a
line are kept as they are (in `Question.extra`); category names are free text (an unknown
category is kept, never renamed or dropped). Three extra keys are checked because the suite renders them
into the prompts: ``system``, ``tools`` and ``tool_results`` (see speczoo.bench.suite.turn_messages).
The built-in set lives in ``bench/data/questions.jsonl``; the agentic traces are built at run time
(speczoo.bench.agentic).

This module only reads and selects questions (tests write them: tests/question_files.py). It must
never run a model, and never silently skip a line it cannot read: a malformed line is an error that
names the file and the line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

# The categories of the built-in set, in the order reports list them.
CATEGORIES: tuple[str, ...] = (
    "verbatim", "code_edit", "code_completion", "rag", "summarization",
    "translation", "math", "writing", "multi_turn",
)

BUILTIN = "builtin"   # the name that selects the built-in set where a file is expected


@dataclass
class Question:
    question_id: int
    category: str
    turns: list[str]
    extra: dict = field(default_factory=dict)   # any other keys of the Spec-Bench row


class QuestionFileError(ValueError):
    """A question file cannot be read; the message names the file and, where it applies, the line."""


def parse_row(row: object, where: str) -> Question:
    """One decoded JSON value → Question; `where` ("file:line") goes into every error message."""
    if not isinstance(row, dict):
        raise QuestionFileError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in ("question_id", "category", "turns") if k not in row]
    if missing:
        raise QuestionFileError(f"{where}: missing key(s) {', '.join(missing)} "
                                "(a Spec-Bench row needs question_id, category, turns)")
    qid, category, turns = row["question_id"], row["category"], row["turns"]
    if isinstance(qid, bool) or not isinstance(qid, int):
        raise QuestionFileError(f"{where}: question_id must be an integer, got {qid!r}")
    if not isinstance(category, str) or not category.strip():
        raise QuestionFileError(f"{where}: category must be a non-empty string, got {category!r}")
    if (not isinstance(turns, list) or not turns
            or not all(isinstance(t, str) and t for t in turns)):
        raise QuestionFileError(f"{where}: turns must be a non-empty list of non-empty strings")
    extra = {k: v for k, v in row.items() if k not in ("question_id", "category", "turns")}
    check_conversation_keys(extra, len(turns), where)
    return Question(question_id=qid, category=category, turns=list(turns), extra=extra)


def check_conversation_keys(extra: dict, n_turns: int, where: str) -> None:
    """The optional keys the suite renders into the prompts: `system` (a string), `tools` (a list of
    OpenAI tool definitions) and `tool_results` (one string or null per turn)."""
    if "system" in extra and not isinstance(extra["system"], str):
        raise QuestionFileError(f"{where}: system must be a string (the system message)")
    if "tools" in extra and not (isinstance(extra["tools"], list)
                                 and all(isinstance(t, dict) for t in extra["tools"])):
        raise QuestionFileError(f"{where}: tools must be a list of OpenAI tool objects")
    results = extra.get("tool_results")
    if "tool_results" in extra and not (isinstance(results, list) and len(results) == n_turns
                                        and all(r is None or isinstance(r, str) for r in results)):
        raise QuestionFileError(f"{where}: tool_results must be a list with one string or null per turn "
                                f"({n_turns} turns)")


def parse_lines(lines: list[str], source: str) -> list[Question]:
    """Parse Spec-Bench JSON lines. Blank lines are allowed; ids must be unique."""
    questions: list[Question] = []
    seen: dict[int, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise QuestionFileError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        q = parse_row(row, where)
        if q.question_id in seen:
            raise QuestionFileError(f"{where}: question_id {q.question_id} already used on line "
                                    f"{seen[q.question_id]}; ids must be unique")
        seen[q.question_id] = lineno
        questions.append(q)
    if not questions:
        raise QuestionFileError(f"{source}: no questions in the file (it is empty); expected one JSON "
                                'object per line like {"question_id": 1, "category": "rag", "turns": ["..."]}')
    return questions


def read_questions(path: str | Path) -> list[Question]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"question file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    return parse_lines(text.splitlines(), str(path))


def builtin_path() -> Path:
    return Path(str(resources.files("speczoo.bench") / "data" / "questions.jsonl"))


def builtin_questions() -> list[Question]:
    """The question set that ships with speczoo (≥ 8 questions in each of CATEGORIES)."""
    return read_questions(builtin_path())


def load_questions(source: str | Path | None) -> list[Question]:
    """`None` or "builtin" → the built-in set; anything else is a path to a Spec-Bench file."""
    if source is None or str(source) == BUILTIN:
        return builtin_questions()
    return read_questions(source)


def categories_of(questions: list[Question]) -> list[str]:
    """Categories present, built-in ones first in their usual order, then others as first seen."""
    present = list(dict.fromkeys(q.category for q in questions))
    known = [c for c in CATEGORIES if c in present]
    return known + [c for c in present if c not in CATEGORIES]


def select(questions: list[Question], categories: list[str] | None = None,
           limit: int | None = None) -> list[Question]:
    """Keep the named categories (all when None), then at most `limit` questions of each category.

    Order is preserved. A category name that no question has is an error listing the ones there are.
    """
    if categories:
        present = categories_of(questions)
        unknown = [c for c in categories if c not in present]
        if unknown:
            raise ValueError(f"no question has category {', '.join(unknown)}; "
                             f"categories in this set: {', '.join(present)}")
        wanted = set(categories)
        questions = [q for q in questions if q.category in wanted]
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit must be >= 1, got {limit}")
        taken: dict[str, int] = {}
        kept = []
        for q in questions:
            if taken.get(q.category, 0) < limit:
                taken[q.category] = taken.get(q.category, 0) + 1
                kept.append(q)
        questions = kept
    return questions
