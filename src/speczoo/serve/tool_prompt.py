"""An OpenAI chat request's tools, turned into what the model's own chat template renders and what its
answer is read with.

`template_messages` gives the template OpenAI's message dicts, as transformers and llama.cpp do, with a
call's `arguments` (a JSON string on the wire) turned into the object templates expect (`| tojson`).
`plan_tools` checks `tools` and `tool_choice` against the template (the format it speaks, from
tool_formats.py) and returns a `ToolPlan`: the tools to render, the rules a call must follow, and for
`required` or a named function the start of a call written after the generation prompt (the answer
then begins inside a call, so the model cannot answer without one). Without tools, or with
`tool_choice: "none"`, there is no plan: tools are not rendered and the answer is not parsed, so a
model that is not shown the tools answers in prose. Every mistake in the request is a 400 here, before
anything is queued.

This module never runs a model and never reads an answer's text itself (tool_calls.py does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from speczoo.serve.api_errors import APIError
from speczoo.serve.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice
from speczoo.serve.tool_calls import Answer, CallRules, ToolCallParser, read_answer
from speczoo.serve.tool_formats import ToolFormat, UnknownToolFormat, detect_format


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools are rendered and its answer read."""

    tools: list[dict]          # OpenAI's tool dicts, passed to the template as `tools`
    fmt: ToolFormat
    rules: CallRules
    prefill: str               # written after the generation prompt: the answer starts with it

    def parser(self) -> ToolCallParser:
        """A parser for this request's answer, already fed the prefill (which opens a call: nothing shows)."""
        parser = ToolCallParser(self.fmt, self.rules)
        parser.feed(self.prefill)
        return parser

    def read(self, text: str) -> Answer:
        """The whole answer `text` (what the model wrote after the prefill), read."""
        return read_answer(self.parser(), text)


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """The conversation as the chat template receives it: OpenAI's dicts, arguments as objects."""
    out = []
    for i, m in enumerate(messages):
        d: dict = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            d["tool_calls"] = [_call_dict(c, f"messages.{i}.tool_calls.{j}") for j, c in enumerate(m.tool_calls)]
        if m.role == "tool":
            if not m.tool_call_id:
                raise APIError(400, f"messages[{i}] has role 'tool' but no tool_call_id: a tool message "
                               "answers one call, named by its id", param=f"messages.{i}.tool_call_id")
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def _call_dict(call, where: str) -> dict:
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError as exc:
        raise APIError(400, f"{where}.function.arguments is not JSON ({exc}): send the arguments the "
                       "model wrote, a JSON object as a string", param=f"{where}.function.arguments") from None
    return {"id": call.id, "type": "function",
            "function": {"name": call.function.name, "arguments": arguments}}


def _format(template: str | None, param: str, what: str) -> ToolFormat:
    """The tool format of `template`, or the 400 saying this model cannot take `what`."""
    try:
        fmt = detect_format(template)
    except UnknownToolFormat as exc:
        raise APIError(400, f"{exc}, so it cannot take {what}", param=param) from None
    if fmt is None:
        raise APIError(400, f"this model's chat template defines no tool calling, so it cannot take {what}: "
                       "use a model whose template does (e.g. qwen2.5-coder-0.5b)", param=param)
    return fmt


def plan_tools(body: ChatCompletionRequest, template: str | None) -> ToolPlan | None:
    """The request's tool plan for a model whose chat template is `template` (None: no tools in play)."""
    choice = body.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    if any(m.tool_calls or m.role == "tool" for m in body.messages):
        _format(template, "messages", "a conversation with tool calls and results")
    if not body.tools:
        if named is not None or choice == "required":
            raise APIError(400, "tool_choice asks for a tool call, but the request has no tools",
                           param="tool_choice")
        return None
    if choice == "none":
        return None
    fmt = _format(template, "tools", "tools")
    names = [t.function.name for t in body.tools]
    if len(set(names)) != len(names):
        raise APIError(400, f"tools name a function more than once: {names}", param="tools")
    if named is not None and named not in names:
        raise APIError(400, f"tool_choice names {named!r}, which is not among the tools {names}",
                       param="tool_choice")
    required = named is not None or choice == "required"
    rules = CallRules(names=frozenset(names), named=named, required=required, parallel=body.parallel_tool_calls)
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    return ToolPlan(tools=tools, fmt=fmt, rules=rules, prefill=fmt.prefill(named) if required else "")
