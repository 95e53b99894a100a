"""Log-probabilities on the wire: the emitted tokens' TokenLogprobs (speczoo/events.py) in OpenAI's chat
shape (also Ollama's) and its completions shape, each token with its text, bytes and text offset.

A token is handed out only with the text it belongs to: `LogprobTrack.take(upto)` releases the tokens
whose text starts before character `upto` of the answer as sent so far, so a token held back with a
possible stop string waits for it, and the tokens past a stop string (a speculative round may emit
several after it) never show: streamed or whole, speculative or plain, an answer reports the same
tokens. This module never runs a model and never sees the engine.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from speczoo.events import DoneEvent, TokenEvent, TokenLogprob


def token_text(data: bytes) -> str:
    """A token's text; one that is not whole UTF-8 (a piece of a character) as OpenAI writes it, `bytes:\\xe2\\x80`."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


@dataclass(frozen=True)
class WireToken:
    """One emitted token as the APIs report it: text, bytes, log-probability, the character of the answer
    where its text starts, and its row's most likely tokens (text, bytes, log-probability)."""

    text: str
    data: bytes
    logprob: float
    offset: int
    top: tuple[tuple[str, bytes, float], ...]


class LogprobTrack:
    """One answer's tokens in the order emitted. piece_bytes: the tokenizer's id -> bytes (a special token
    as its text, as the answer's text shows it)."""

    def __init__(self, piece_bytes: Callable[[int], bytes]):
        self.piece = piece_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chars = 0                                  # characters of the answer before the next token
        self._held: deque[WireToken] = deque()
        self._sent = 0                                   # characters of the answer streamed so far

    def add(self, logprobs: list[TokenLogprob] | None) -> None:
        for lp in logprobs or ():
            data = self.piece(lp.id)
            top = tuple((token_text(self.piece(i)), self.piece(i), v) for i, v in lp.top)
            self._held.append(WireToken(token_text(data), data, lp.logprob, self._chars, top))
            self._chars += len(self._utf8.decode(data))

    def take(self, upto: int) -> list[WireToken]:
        """The held tokens whose text starts before character `upto` of the answer."""
        out = []
        while self._held and self._held[0].offset < upto:
            out.append(self._held.popleft())
        return out

    def streamed(self, event: TokenEvent | DoneEvent) -> list[WireToken]:
        """The tokens to send with one event of a stream: those whose text the stream has now sent."""
        if isinstance(event, TokenEvent):
            self._sent += len(event.text)
            self.add(event.logprobs)
        return self.take(self._sent)

    def whole(self, done: DoneEvent) -> list[WireToken]:
        """The tokens of a whole (non-streamed) answer."""
        self.add(done.logprobs)
        return self.take(len(done.text))


def chat_content(tokens: list[WireToken]) -> list[dict]:
    """OpenAI's chat `logprobs.content` (and Ollama's `logprobs`): token, logprob, bytes, top_logprobs."""
    return [{"token": t.text, "logprob": t.logprob, "bytes": list(t.data),
             "top_logprobs": [{"token": s, "logprob": v, "bytes": list(b)} for s, b, v in t.top]} for t in tokens]


def completion_logprobs(tokens: list[WireToken]) -> dict:
    """OpenAI's completions `logprobs`: tokens, token_logprobs, top_logprobs (the alternatives and the
    chosen token, by text) and text_offset (characters from the start of the completion)."""
    return {"tokens": [t.text for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [_top_with_chosen(t) for t in tokens],
            "text_offset": [t.offset for t in tokens]}


def _top_with_chosen(t: WireToken) -> dict[str, float]:
    top = {s: v for s, _, v in t.top}
    top.setdefault(t.text, t.logprob)          # "the logprob of the sampled token" is always there
    return top
