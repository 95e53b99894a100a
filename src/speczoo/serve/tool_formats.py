"""The tool-call formats speczoo can read from a model's answer, and which one a chat template speaks.

A chat template that defines tools teaches the model one way to write a call. Each `ToolFormat` here
names one such way (the text that opens a call, what closes it, the key that holds the arguments) and
the template text that shows a template uses it; `detect_format(template)` picks it from the template
the GGUF carries, once per request. Adding a format is one entry in `FORMATS`.

This module only describes formats: it never parses an answer (tool_calls.py does) and never renders a
template (tool_prompt.py does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Opener:
    """Text that opens a call in the answer, and what closes it."""

    text: str
    close: str | None              # None: the call's JSON object ends it
    lenient: bool = False          # what it opens may be plain text (then it is shown as such)


BARE_JSON = Opener("", None, lenient=True)   # a JSON object opening the answer (or following a call)


@dataclass(frozen=True)
class ToolFormat:
    """One way a model writes a tool call."""

    name: str
    models: str                    # who writes it (for docs and messages)
    markers: tuple[str, ...]       # all of these in a chat template: it speaks this format
    opens: tuple[Opener, ...]      # what opens a call anywhere in the answer (the first: the canonical one)
    bare_json: bool                # a JSON object at the start of the answer (or after a call) may be a call
    arguments_key: str             # where the template puts the arguments, and the model writes them

    def arguments_of(self, payload: dict) -> object:
        """The arguments of a decoded call (either key is taken: models mix them up)."""
        for key in (self.arguments_key, "arguments", "parameters"):
            if key in payload:
                return payload[key]
        return {}

    def call_start(self, name: str | None) -> str:
        """The text an answer is started with to make it a call (to `name`, when given). It ends where
        the model's own tokens would end (after a special-token opener, or after a colon): BPE joins a
        space or newline to what follows it, so a start ending in one pushes the model off its tokens."""
        first = self.opens[0]
        opener = first.text + "\n" if first.close is not None else ""
        if name is None:
            return opener + '{"name":'
        return opener + '{"name": ' + json.dumps(name) + f', "{self.arguments_key}":'


HERMES = ToolFormat(
    name="hermes", models="Qwen2.5, Qwen3, Hermes 2/3 (and their fine-tunes)",
    markers=("<tool_call>",), bare_json=True, arguments_key="arguments",
    # Small Qwen models often write the call bare, or in a JSON code fence (llama.cpp's parser reads both).
    opens=(Opener("<tool_call>", "</tool_call>"), Opener("```json", "```", lenient=True)))

LLAMA3_JSON = ToolFormat(
    name="llama3_json", models="Llama 3.1, 3.2, 3.3 (JSON tool calls, with or without <|python_tag|>)",
    markers=("<|start_header_id|>", "tool_call"), opens=(Opener("<|python_tag|>", None),), bare_json=True,
    arguments_key="parameters")

FORMATS: tuple[ToolFormat, ...] = (HERMES, LLAMA3_JSON)


class UnknownToolFormat(ValueError):
    """The template defines tools, but in a format speczoo cannot read."""


def detect_format(template: str | None) -> ToolFormat | None:
    """The format `template` teaches its model; None when the template defines no tools at all.
    Raises UnknownToolFormat for a template that renders tools in a format not in FORMATS."""
    if not template or "tools" not in template:
        return None
    for fmt in FORMATS:
        if all(m in template for m in fmt.markers):
            return fmt
    raise UnknownToolFormat(
        "this model's chat template defines tools in a format speczoo cannot parse yet (it knows "
        + ", ".join(f"{f.name}: {f.models}" for f in FORMATS) + ")")
