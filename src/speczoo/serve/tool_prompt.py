"""An OpenAI chat request's tools, turned into what the model's own chat template renders and what its
answer is read with.

`template_messages` gives the template OpenAI's message dicts, as transformers and llama.cpp do, with a
call's `arguments` (a JSON string on the wire) turned into the object templates expect (`| tojson`).
`plan_tools` checks `tools` and `tool_choice` against the template (the format it speaks, from
tool_formats.py) and returns a `ToolPlan`: the tools to render, the rules a call must follow, and for
`required` or a named function the start of a call written after the generation prompt (the answer
then begins inside a call, so the model cannot answer without one; tool_grammar.py gives the grammar
the rest is decoded inside). `plan` does the same for any API's request (Ollama's /api/chat too), and
`chat_prompt_ids` renders either API's chat prompt with its plan. Without tools, or with `tool_choice:
"none"`, there is no plan: tools are not rendered and the answer is not parsed, so a
model that is not shown the tools answers in prose (OpenAI shows them and reads no call; a small model
shown tools calls them anyway, and its call would land in content as markup). A template that defines no
tools cannot take tools, nor a conversation with calls and results: a 400, since no format it was
trained on exists to write them in (llama.cpp's generic fallback prompt needs grammar-constrained
decoding to be reliable; it can come with it). Every mistake is a 400 here, before anything is queued.

This module never runs a model and never reads an answer's text itself (tool_calls.py does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from speczoo.chat import render_chat_prompt
from speczoo.errors import SpeczooError
from speczoo.serve.api_errors import APIError
from speczoo.serve.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice, Tool
from speczoo.serve.tool_calls import Answer, CallRules, ToolCallParser, read_answer
from speczoo.serve.tool_formats import ToolFormat, UnknownToolFormat, detect_format

# The codes of the 400s the published schema cannot express: they depend on the model's template, or on
# two fields together.
UNSUPPORTED = "tools_not_supported"
MISMATCH = "tool_choice_mismatch"


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools are rendered and its answer read."""

    tools: list[dict]          # OpenAI's tool dicts, passed to the template as `tools`
    fmt: ToolFormat
    rules: CallRules
    call_start: str            # written after the generation prompt: the answer starts with it

    def parser(self) -> ToolCallParser:
        """A parser for this request's answer, already fed its call_start (which opens a call: nothing shows)."""
        parser = ToolCallParser(self.fmt, self.rules)
        parser.feed(self.call_start)
        return parser

    def read(self, text: str) -> Answer:
        """The whole answer `text` (what the model wrote after the call_start, if any), read."""
        return read_answer(self.parser(), text)


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """The conversation as the chat template receives it: OpenAI's dicts, arguments as objects (an
    argument string that is not JSON is passed on as the string: it is what the client sent)."""
    out = []
    for m in messages:
        d: dict = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function",
                                "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                               for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def _arguments(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _format(template: str | None, param: str, what: str) -> ToolFormat:
    """The tool format of `template`, or the 400 saying this model cannot take `what`."""
    try:
        fmt = detect_format(template)
    except UnknownToolFormat as exc:
        raise APIError(400, f"{exc}, so it cannot take {what}", param=param, code=UNSUPPORTED) from None
    if fmt is None:
        raise APIError(400, f"this model's chat template defines no tool calling, so it cannot take {what}: "
                       "use a model whose template does (e.g. qwen2.5-coder-0.5b)", param=param, code=UNSUPPORTED)
    return fmt


def _mismatch(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code=MISMATCH)


def plan_tools(body: ChatCompletionRequest, template: str | None) -> ToolPlan | None:
    """The OpenAI request's tool plan for a model whose chat template is `template` (None: no tools in play)."""
    choice = body.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    return plan(body.messages, body.tools, template, choice if isinstance(choice, str) else None, named,
                body.parallel_tool_calls)


def plan(messages: list[ChatMessage], tools: list[Tool] | None, template: str | None, choice: str | None = None,
         named: str | None = None, parallel: bool = True) -> ToolPlan | None:
    """The tool plan of a conversation offered `tools` (any API's request, in OpenAI's models): choice
    "none", "auto", "required" or None (auto); named: the function tool_choice names."""
    if any(m.tool_calls or m.role == "tool" for m in messages):
        _format(template, "messages", "a conversation with tool calls and results")
    if not tools:
        if named is not None or choice == "required":
            raise _mismatch("tool_choice asks for a tool call, but the request has no tools", "tool_choice")
        return None
    if choice == "none":
        return None
    fmt = _format(template, "tools", "tools")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise _mismatch(f"tools name a function more than once: {names}", "tools")
    if named is not None and named not in names:
        raise _mismatch(f"tool_choice names {named!r}, which is not among the tools {names}", "tool_choice")
    required = named is not None or choice == "required"
    rules = CallRules(names=frozenset(names), named=named, required=required, parallel=parallel)
    dicts = [t.model_dump(exclude_none=True) for t in tools]
    return ToolPlan(tools=dicts, fmt=fmt, rules=rules, call_start=fmt.call_start(named) if required else "")


def chat_prompt_ids(tokenizer, messages: list[ChatMessage], tools: ToolPlan | None) -> list[int]:
    """The prompt of a chat request (any API's), rendered through the model's own template with the
    plan's tools and its call_start after the generation prompt; a template that refuses it is a 400."""
    try:
        prompt = render_chat_prompt(tokenizer, template_messages(messages), tools=tools.tools if tools else None)
    except (ValueError, SpeczooError) as exc:      # e.g. a template that rejects the role order
        raise APIError(400, f"cannot apply the chat template: {exc}", param="messages") from exc
    return tokenizer.encode(prompt + (tools.call_start if tools else ""))
