"""The terminal chat's logic: multi-turn history through the chat template, streaming answers, commands.

`ChatSession` takes input lines and writes to any text stream, so it is tested without a terminal
(feed lines, capture output); `speczoo chat` only wires it to stdin/stdout. Commands: /spec MODE,
/stats, /reset, /save FILE, /help, /quit. `render_chat_prompt` is shared with the server.
It only consumes the runtime's events; it never touches a model or a cache.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, TextIO

from speczoo.decoding.prompt_checks import fits
from speczoo.errors import SpeczooError
from speczoo.events import DoneEvent, Stats, TokenEvent
from speczoo.request import GenerationRequest, SamplingParams

# An empty reasoning block after the generation prompt: reasoning models (Qwen3, DeepSeek-R1 style
# templates) then answer directly instead of thinking first.
THINK_PRESEED = "<think>\n\n</think>\n\n"

HELP = """commands:
  /spec [on|off|ngram|draft|auto]  speculative decoding mode (no argument: show it)
  /stats                           speed of the last answer and of the session
  /reset                           forget the conversation
  /save FILE                       write the conversation as JSON
  /help                            this text
  /quit                            leave (also Ctrl-D)"""


def render_chat_prompt(tokenizer, messages: list[dict], no_think: bool = False,
                       tools: list[dict] | None = None) -> str:
    """The prompt text for `messages` (dicts with role and content, and OpenAI's tool_calls /
    tool_call_id where they have them), ready for the assistant's turn; `tools` (OpenAI's function
    tool dicts) are given to the template as transformers gives them."""
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **extra)
    return text + THINK_PRESEED if no_think else text


@dataclass
class Totals:
    answers: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, s: Stats) -> None:
        self.answers += 1
        self.new_tokens += s.new_tokens
        self.seconds += s.seconds
        self.rounds += s.rounds
        self.drafted += s.drafted
        self.accepted += s.accepted


@dataclass
class ChatSession:
    """One conversation with a runtime. `feed(lines)` runs it; `out` receives everything printed."""

    runtime: object
    spec: str = "auto"
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    system: str | None = None
    no_think: bool = False
    out: TextIO = sys.stdout
    messages: list[dict] = field(default_factory=list)
    last: Stats | None = None
    totals: Totals = field(default_factory=Totals)

    def __post_init__(self) -> None:
        self.spec = self._resolve_spec(self.spec)
        self._reset_messages()

    # -- driving -----------------------------------------------------------------------------
    def feed(self, lines: Iterable[str]) -> None:
        """Handle lines until /quit or the end of input."""
        for line in lines:
            if not self.handle(line):
                return

    def handle(self, line: str) -> bool:
        """One input line: a command or a user turn. Returns False when the session should end."""
        line = line.strip()
        if not line:
            return True
        if line.startswith("/"):
            return self._command(line)
        self.ask(line)
        return True

    def say(self, text: str = "", end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    # -- a turn --------------------------------------------------------------------------------
    def ask(self, text: str) -> str:
        """Send one user turn, stream the answer to `out`, keep both in the history; return the answer."""
        self.messages.append({"role": "user", "content": text})
        tok = self.runtime.tokenizer
        try:
            prompt_ids = tok.encode(render_chat_prompt(tok, self.messages, self.no_think))
        except SpeczooError as exc:                             # e.g. a template that rejects the conversation
            self.messages.pop()
            self.say(f"[error: {exc}]")
            return ""
        room = self.runtime.max_seq - len(prompt_ids)          # the most the answer may take
        if not fits(len(prompt_ids), 1, self.runtime.max_seq):
            self.messages.pop()
            self.say(f"[the conversation ({len(prompt_ids)} tokens) no longer fits the context of "
                     f"{self.runtime.max_seq} tokens: /reset, or restart with a larger --max-seq]")
            return ""
        request = GenerationRequest(
            prompt_ids=prompt_ids, max_new_tokens=min(self.max_tokens, room),
            sampling=SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed),
            spec=self.spec)
        parts: list[str] = []
        done: DoneEvent | None = None
        try:
            gen = self.runtime.generate(request)
        except (SpeczooError, ValueError) as exc:
            self.messages.pop()
            self.say(f"[error: {exc}]")
            return ""
        try:
            for event in gen:
                if isinstance(event, TokenEvent):
                    parts.append(event.text)
                    self.say(event.text, end="")
                elif isinstance(event, DoneEvent):
                    done = event
        except KeyboardInterrupt:
            self.say(" [stopped]", end="")
        finally:
            gen.close()
        self.say()
        answer = done.text if done is not None else "".join(parts)
        self.messages.append({"role": "assistant", "content": answer})
        if done is not None:
            self.last = done.stats
            self.totals.add(done.stats)
        return answer

    # -- commands ------------------------------------------------------------------------------
    def _command(self, line: str) -> bool:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/spec":
            self._set_spec(arg)
        elif name == "/stats":
            self.say(self.stats_text())
        elif name == "/reset":
            self._reset_messages()
            self.say("[conversation cleared]")
        elif name == "/save":
            self._save(arg)
        elif name == "/help":
            self.say(HELP)
        else:
            self.say(f"[unknown command {name}; /help lists them]")
        return True

    def _resolve_spec(self, mode: str) -> str:
        modes = list(self.runtime.spec_modes)
        if mode == "on":
            on = [m for m in ("auto", "ngram", "draft") if m in modes]
            if not on:
                raise ValueError(f"this runtime offers no speculative mode (only {modes})")
            return on[0]
        if mode not in modes:
            raise ValueError(f"unknown speculative mode {mode!r}: use on or one of {modes}")
        return mode

    def _set_spec(self, arg: str) -> None:
        if not arg:
            self.say(f"[spec: {self.spec}; available: on, {', '.join(self.runtime.spec_modes)}]")
            return
        try:
            self.spec = self._resolve_spec(arg)
        except ValueError as exc:
            self.say(f"[{exc}]")
            return
        self.say(f"[spec: {self.spec}]")

    def stats_text(self) -> str:
        if self.last is None:
            return "[no answer yet]"
        s, t = self.last, self.totals
        session_tok_s = t.new_tokens / t.seconds if t.seconds > 0 else 0.0
        session_apr = t.accepted / t.rounds if t.rounds else 0.0
        return (f"[last: {s.new_tokens} tokens in {s.seconds:.2f} s = {s.tok_s:.1f} tok/s, "
                f"{s.rounds} rounds, accepted/round {s.accepted_per_round:.2f} "
                f"({s.accepted}/{s.drafted} drafted), drafter: {s.drafter}, prefill {s.prefill_seconds:.2f} s]\n"
                f"[session: {t.answers} answers, {t.new_tokens} tokens, {session_tok_s:.1f} tok/s, "
                f"accepted/round {session_apr:.2f}; spec now: {self.spec}]")

    def _reset_messages(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def _save(self, arg: str) -> None:
        if not arg:
            self.say("[usage: /save FILE]")
            return
        path = Path(arg).expanduser()
        data = {"model": self.runtime.name, "spec": self.spec, "no_think": self.no_think,
                "messages": self.messages, "last_stats": asdict(self.last) if self.last else None}
        try:
            path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            self.say(f"[cannot save to {path}: {exc}]")
            return
        self.say(f"[saved {len(self.messages)} messages to {path}]")
