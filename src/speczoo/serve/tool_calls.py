"""The model's tool-call text read back as OpenAI `tool_calls`, whole or as the answer streams.

`ToolCallParser` is fed the answer's text in pieces of any size (a round's text, or all of it at once)
and returns what may be shown so far: plain text for `content`, and each call once it is complete (id,
type "function", name, arguments as a JSON string). Text that may still become a call (a marker cut in
two, a call not yet closed) is held back, so content never shows a call's markup. `parse_answer` is the
same parser fed the whole answer, so a streamed answer always adds up to the whole one.

A call the model got wrong (not JSON, an unknown function, another function than tool_choice names, a
call left open at the end) is never an exception: its raw text goes to `content` and `error` says what
was wrong. Whitespace before a returned call is dropped (the separator after it stays), so an answer
of calls only has no content (None), and an answer without call markup is its text exactly.

JSON is read with the standard library's `json`; this module never uses regular expressions on JSON
and never renders a prompt.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from speczoo.serve.tool_formats import BARE_JSON, Opener, ToolFormat

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class CallRules:
    """What the request allows the model to call."""

    names: frozenset[str]          # the functions offered in `tools`
    named: str | None = None       # tool_choice names this function
    required: bool = False         # tool_choice "required" (or named): an answer without a call is wrong
    parallel: bool = True          # parallel_tool_calls: more than one call per answer


@dataclass
class Delta:
    """What a piece of the answer adds: content text and completed calls (OpenAI's tool_call dicts)."""

    content: str = ""
    calls: list[dict] = field(default_factory=list)


@dataclass
class Answer:
    content: str | None
    calls: list[dict]
    error: str | None              # why some tool-call text was not returned as a call


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Feed it the answer's text in pieces; each feed returns what can be shown now."""

    def __init__(self, fmt: ToolFormat, rules: CallRules):
        self.fmt, self.rules = fmt, rules
        self._pending = ""          # text not yet classified
        self._in_call: Opener | None = None   # what opened the call being read
        self._space = ""            # whitespace held back (dropped before a returned call)
        self._shown_text = False    # content was shown (a bare JSON object is then no longer a call)
        self.calls: list[dict] = []
        self.errors: list[str] = []

    # -- feeding -------------------------------------------------------------------------------
    def feed(self, text: str) -> Delta:
        self._pending += text
        out = Delta()
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> Delta:
        """The end of the answer: held-back text is shown; a call left open is an error."""
        out = Delta()
        while self._step(out, final=True):
            pass
        if self._in_call is not None:                   # a call never closed
            self._close_at_end(out)
        if self._space and not self.calls:
            out.content += self._space
        self._space = ""
        if self.rules.required and not self.calls:
            what = f"a call to {self.rules.named!r}" if self.rules.named else "a tool call"
            self.errors.append(f"tool_choice asked for {what}, but the model answered without one")
        return out

    def _close_at_end(self, out: Delta) -> None:
        """The answer ended inside a call: a complete JSON call in it is taken (the model ended its turn
        instead of writing the closing marker, as small models do); anything else is shown as text."""
        opener, body = self._in_call, self._pending
        self._in_call, self._pending = None, ""
        raw = opener.text + body
        try:
            _, end = _DECODER.raw_decode(body.lstrip())
            complete = not body.lstrip()[end:].strip()
        except json.JSONDecodeError:
            complete = False
        if complete:
            self._take(out, body, raw, lenient=opener.lenient)
        elif opener.lenient:                            # a lenient opener's unfinished text is just text
            self._text(out, raw)
        else:
            self._wrong(out, raw, "the answer ended inside a tool call that is not complete JSON")

    def answer_error(self) -> str | None:
        return "; ".join(self.errors) or None

    # -- one step of the state machine: True while it made progress --------------------------
    def _step(self, out: Delta, final: bool) -> bool:
        if self._in_call is None:
            return self._step_text(out, final)
        return self._step_call(out)

    def _step_text(self, out: Delta, final: bool) -> bool:
        text = self._pending
        if not text:
            return False
        if self._bare_json_allowed():
            start = len(text) - len(text.lstrip())
            if self.calls and text[start:start + 1] == ";":    # Llama 3.2 writes calls as `{..}; {..}`
                self._pending = text[start + 1:]
                return True
            if start < len(text) and text[start] == "{":
                self._text(out, text[:start])
                self._pending, self._in_call = text[start:], BARE_JSON
                return True
            if start == len(text) and not final:       # only whitespace yet: wait for more
                return False
        hits = [(text.find(o.text), i) for i, o in enumerate(self.fmt.opens) if o.text in text]
        if hits:
            at, i = min(hits)
            opener = self.fmt.opens[i]
            self._text(out, text[:at])
            self._pending, self._in_call = text[at + len(opener.text):], opener
            return True
        keep = 0 if final else _partial_marker(text, [o.text for o in self.fmt.opens])
        shown, self._pending = text[:len(text) - keep], text[len(text) - keep:]
        self._text(out, shown)
        return False

    def _step_call(self, out: Delta) -> bool:
        body, opener = self._pending, self._in_call
        if opener.close is not None:
            at = body.find(opener.close)
            if at < 0:
                return False
            raw = opener.text + body[:at + len(opener.close)]
            self._pending, self._in_call = body[at + len(opener.close):], None
            self._take(out, body[:at], raw, lenient=opener.lenient)
            return True
        stripped = body.lstrip()
        try:
            _, end = _DECODER.raw_decode(stripped)
        except json.JSONDecodeError:
            return False                                # incomplete (or never valid: finish() says so)
        end += len(body) - len(stripped)
        raw = opener.text + body[:end]
        self._pending, self._in_call = body[end:], None
        self._take(out, body[:end], raw, lenient=opener.lenient)
        return True

    # -- what a closed call becomes ---------------------------------------------------------
    def _take(self, out: Delta, payload: str, raw: str, lenient: bool) -> None:
        """A complete call's text: a call, or (wrong) raw content with an error; what a lenient opener
        opened (a bare JSON object, a JSON code fence) is plain content unless it is shaped like a call."""
        try:
            value = json.loads(payload)
        except json.JSONDecodeError as exc:
            if lenient:
                self._text(out, raw)
            else:
                self._wrong(out, raw, f"a tool call is not valid JSON ({exc})")
            return
        if lenient and not (isinstance(value, dict) and "name" in value
                            and {"arguments", "parameters"} & value.keys()):
            self._text(out, raw)           # JSON, but not shaped like a call: plain text
            return
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            self._wrong(out, raw, 'a tool call is not a JSON object with a "name"')
            return
        name, arguments = value["name"], self.fmt.arguments_of(value)
        if isinstance(arguments, str):          # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if name not in self.rules.names:
            self._wrong(out, raw, f"the model called {name!r}, which is not among the tools "
                        f"({', '.join(sorted(self.rules.names))})")
        elif self.rules.named is not None and name != self.rules.named:
            self._wrong(out, raw, f"the model called {name!r}, but tool_choice names {self.rules.named!r}")
        elif not isinstance(arguments, dict):
            self._wrong(out, raw, f"the arguments of the call to {name!r} are not a JSON object")
        elif self.calls and not self.rules.parallel:
            self._wrong(out, raw, "parallel_tool_calls is false: only the first call is returned")
        else:
            call = {"index": len(self.calls), "id": new_call_id(), "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
            self.calls.append(call)
            out.calls.append(call)
            self._space = ""

    def _wrong(self, out: Delta, raw: str, why: str) -> None:
        self.errors.append(why)
        self._text(out, raw)

    def _text(self, out: Delta, text: str) -> None:
        """Show `text` as content, holding back trailing whitespace (it may turn out to sit before a call)."""
        if not text:
            return
        body = text.rstrip()
        if body:
            out.content += self._space + body
            self._space = text[len(body):]
            self._shown_text = True
        else:
            self._space += text

    def _bare_json_allowed(self) -> bool:
        return self.fmt.bare_json and not self._shown_text


def _partial_marker(text: str, markers: list[str]) -> int:
    """How many of `text`'s last characters may be the start of a marker (so must wait for more)."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


def read_answer(parser: ToolCallParser, text: str) -> Answer:
    """The rest of an answer fed to `parser` at once: its content, calls and error (exactly what a
    stream of it adds up to)."""
    first, last = parser.feed(text), parser.finish()
    content = first.content + last.content
    calls = first.calls + last.calls
    return Answer(content=content if content or not calls else None, calls=calls, error=parser.answer_error())


def parse_answer(fmt: ToolFormat, rules: CallRules, text: str) -> Answer:
    """The whole answer `text`, read."""
    return read_answer(ToolCallParser(fmt, rules), text)


def finish_reason(base: str, called: bool) -> str:
    """OpenAI's finish_reason: "tool_calls" when the answer made a call, unless it ran out of tokens."""
    return "tool_calls" if called and base != "length" else base
