"""The grammar of a forced tool call: `tool_choice` "required" or a named function, decoded inside it.

A forced answer starts with the plan's call_start after the generation prompt (tool_prompt.py); this
module gives the grammar of the rest, in llguidance's Lark dialect (speczoo/grammar.py): the name of one
of the tools (or the named one), the `arguments` as that function's `parameters` JSON schema (%json, laid
out as the template writes it, on one line), the call's closing text, with parallel_tool_calls more whole
calls of the same shape, and a newline at most. The answer then always is a call whose arguments match
the schema, and the engine's constrained decoding keeps speculation lossless against constrained
greedy. A marker that is one token of the model's vocabulary (Qwen's `</tool_call>`, a special token
llguidance will not match as text) is written as that token (`<[id]>`), so the grammar takes the
model's own token.

A parameters schema llguidance cannot honour is a 400 naming `tools`. This module never reads an answer
and never runs a model.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from speczoo.grammar import JSON_LAYOUT, check
from speczoo.request import Constraint
from speczoo.serve.api_errors import APIError
from speczoo.serve.structured import INVALID_SCHEMA
from speczoo.serve.tool_prompt import ToolPlan

Encode = Callable[[str], list[int]]


def _text(s: str) -> str:
    """A Lark string literal of `s`."""
    return json.dumps(s, ensure_ascii=False)


def _marker(s: str, encode: Encode) -> str:
    """A call marker as a Lark term: the token itself when the vocabulary holds it as one, else its text."""
    ids = encode(s)
    return f"<[{ids[0]}]>" if len(ids) == 1 and len(s) > 1 else _text(s)


def _arguments_rule(fn: dict) -> str:
    schema = fn.get("parameters") or {"type": "object"}
    return "%json " + json.dumps({"x-guidance": JSON_LAYOUT, **schema}, ensure_ascii=False)


def call_constraint(plan: ToolPlan, encode: Encode) -> Constraint | None:
    """The grammar of the answer after `plan.call_start` (None: the call is not forced); encode: the
    model's tokenizer (text -> ids), to find markers that are single tokens."""
    if not plan.rules.required:
        return None
    fmt, rules = plan.fmt, plan.rules
    opener = fmt.opens[0]
    functions = [t["function"] for t in plan.tools if rules.named in (None, t["function"]["name"])]
    key = _text(f', "{fmt.arguments_key}": ')
    rules_text = [f"args{i}: {_arguments_rule(fn)}" for i, fn in enumerate(functions)]
    body = " | ".join(f"{_text(json.dumps(fn['name']))} {key} args{i}" for i, fn in enumerate(functions))
    close = f'"}}" "\\n" {_marker(opener.close, encode)}' if opener.close is not None else '"}"'
    first = "args0" if rules.named is not None else "body"         # a named call_start ends after the key
    more = rules.parallel and opener.close is not None               # whole calls may follow the first
    # a newline may end the answer (Qwen writes one after </tool_call> before it ends its turn)
    lines = [f'start: " " {first} {close}' + (" more*" if more else "") + ' "\\n"?', f"body: {body}", *rules_text]
    if more:
        again = _text('\n{"name": ')
        lines.append(f'more: "\\n" {_marker(opener.text, encode)} {again} body {close}')
    constraint = Constraint("lark", "\n".join(lines) + "\n")
    try:
        check(constraint)
    except ValueError as exc:
        raise APIError(400, f"tools: a function's parameters cannot be used as a grammar: {exc}", param="tools",
                       code=INVALID_SCHEMA) from None
    return constraint
