"""Writing Spec-Bench question files, for tests: the product only reads them (speczoo/bench/questions.py)."""

from __future__ import annotations

import json
from pathlib import Path

from speczoo.bench.questions import Question


def question_row(q: Question) -> dict:
    """The Spec-Bench row of a question, its extra keys kept."""
    return {"question_id": q.question_id, "category": q.category, "turns": list(q.turns), **q.extra}


def write_questions(path: str | Path, questions: list[Question]) -> None:
    """Write Spec-Bench JSON lines (UTF-8, one object per line, non-ASCII kept readable)."""
    with open(path, "w", encoding="utf-8") as f:
        for q in questions:
            f.write(json.dumps(question_row(q), ensure_ascii=False) + "\n")
