"""The head's chat data: prompts, and the target's own answers to them, logged on disk.

`train-eagle --prompts FILE|builtin` trains on conversations the target itself writes: each prompt goes
through the chat template and the target answers it greedily, several prompts side by side in one
batched greedy decode (speczoo/greedy_many.py: a forward over 8 rows costs far less than 8 decode steps,
docs/eagle.md, and the text is exactly plain greedy's). The conversations are chunked ahead of any corpus (pipeline.py). Answers
cost target decode steps, the dearest part of a CPU run, so each is logged the moment it exists and a
resumed run reads it back. This module never runs a model itself: `answer` comes from the caller.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

from speczoo.training.eagle.features import chunk_stream


# Second and later user turns, asked after the target's answer (`train-eagle --follow-ups N`): requests
# that fit any first turn, so that one prompt yields a multi-turn conversation in the target's own words.
FOLLOW_UPS = (
    "Can you go into more detail on that?",
    "Give me a concrete example.",
    "Summarize your answer in three short bullet points.",
    "What are the most common mistakes people make with this?",
    "Rewrite that for a complete beginner.",
    "How would you make it better?",
    "Can you make it shorter?",
    "Explain the reasoning behind your answer step by step.",
    "What should I ask next to learn more about this?",
    "Suggest a different approach and compare the two.",
    "Turn that into a short checklist.",
    "What would an expert add to your answer?",
)


def conversations(prompts: list[str], follow_ups: int = 0) -> list[list[str]]:
    """Each prompt as the user turns of one conversation: the prompt, then `follow_ups` distinct
    requests from FOLLOW_UPS, chosen by the prompt's own hash (the same prompt always gets the same)."""
    if not 0 <= follow_ups <= len(FOLLOW_UPS):
        raise ValueError(f"follow-ups must be in 0..{len(FOLLOW_UPS)}, got {follow_ups}")
    out = []
    for p in prompts:
        seed = int.from_bytes(hashlib.sha256(p.encode()).digest()[:8], "little")
        out.append([p, *random.Random(seed).sample(FOLLOW_UPS, follow_ups)])
    return out


def answer_chunks(answer: Callable[[list[list[str]]], list[list[int]]], convs: list[list[str]], seq_len: int,
                  separator: int | None = None, group: int = 1) -> Iterator[list[int]]:
    """Chunks of exactly seq_len ids from the target's own answers: `answer(convs)` gives each
    conversation's ids (its user turns through the chat template, each followed by the target's greedy
    reply), so the head learns from the text it will draft for. Lazy: the conversations are answered
    `group` at a time (one packed decode per turn), when their chunks are needed."""
    if group < 1:
        raise ValueError(f"answers are generated in groups of at least 1 prompt, got {group}")

    def pieces() -> Iterator[list[int]]:
        for i in range(0, len(convs), group):
            yield from answer(convs[i:i + group])
    return chunk_stream(pieces(), seq_len, separator)


class AnswerLog:
    """`answer` with a memory on disk: each conversation is appended to a JSONL file (out/answers.jsonl)
    as soon as it is generated, keyed by its user turns and the answer length, and read back instead of
    generated again. An extraction that resumes re-walks the chunk stream up to its first missing shard;
    without the log it would regenerate every answer before it, which even packed (~100 tok/s) is most
    of the time the run had spent. A line torn by an interruption is cut off when the log is opened."""

    def __init__(self, path: Path, answer: Callable[[list[list[str]]], list[list[int]]], max_tokens: int):
        self.path = Path(path)
        self.answer, self.max_tokens = answer, max_tokens
        self.known: dict[str, list[int]] = {}
        self.generated = 0
        if self.path.is_file():
            data = self.path.read_bytes()
            whole = data[:data.rfind(b"\n") + 1]
            if len(whole) < len(data):                       # an append was cut short: drop its piece
                tmp = self.path.with_suffix(".tmp")
                tmp.write_bytes(whole)
                tmp.replace(self.path)
            for line in whole.decode("utf-8").splitlines():
                row = json.loads(line)
                self.known[row["key"]] = row["ids"]

    def key(self, turns: list[str]) -> str:
        """A conversation's key: its user turns and the answer length (one turn: the prompt's key)."""
        return hashlib.sha256(f"{self.max_tokens}\0{chr(0).join(turns)}".encode()).hexdigest()[:24]

    def __call__(self, convs: list[list[str]]) -> list[list[int]]:
        """Each conversation's ids; the ones not in the log are answered together, in one call."""
        todo = list({self.key(c): c for c in convs if self.key(c) not in self.known}.values())
        if todo:
            answers = self.answer(todo)
            if len(answers) != len(todo):
                raise ValueError(f"asked for {len(todo)} answers, got {len(answers)}")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                for c, ids in zip(todo, answers):
                    f.write(json.dumps({"key": self.key(c), "ids": ids}) + "\n")
                    self.known[self.key(c)] = ids
                f.flush()
                os.fsync(f.fileno())
            self.generated += len(todo)
        return [self.known[self.key(c)] for c in convs]


def read_prompts(path: Path) -> list[str]:
    """Prompts for `answer_chunks`: one per non-empty line of a text file (a JSONL line with a "prompt"
    field, or the turns of a Spec-Bench question, is read as that text)."""
    out: list[str] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON object ({e.msg})") from None
            turns = row.get("turns")
            text = row.get("prompt") or (turns[0] if isinstance(turns, list) and turns else None)
            if not isinstance(text, str) or not text:
                raise ValueError(f"{path}:{n}: a JSON line needs a \"prompt\" or \"turns\" field of text: "
                                 f"{line[:80]}")
            out.append(text)
        else:
            out.append(line)
    if not out:
        raise ValueError(f"{path} holds no prompts")
    return out


def builtin_prompts() -> Path:
    """The shipped prompt set for `train-eagle --prompts builtin`: ~300 chat requests of the kinds a
    local assistant gets (stories, explanations, essays, emails, advice, poems, code to write, explain or
    review), written for this project and kept apart from the benchmark prompts and questions."""
    return Path(str(resources.files("speczoo.training.eagle") / "data" / "chat_prompts.jsonl"))


def prompts_digest(prompts: list[str]) -> str:
    return hashlib.sha256("\0".join(prompts).encode()).hexdigest()[:16]
