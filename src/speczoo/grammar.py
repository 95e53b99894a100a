"""Grammars for constrained decoding, compiled by llguidance against a model's tokenizer.

`Grammars(tokenizer, vocab_size)` turns a request's `Constraint` (request.py) into a fresh
`TokenGrammar` per generation: llguidance's token-level matcher (LLMatcher), seen by the engine as a
decoding/constraint.py `Grammar` (a mask of allowed tokens, consume, rollback). llguidance's tokenizer
(LLTokenizer) is built once, on the first constrained request (seconds for a 150k vocabulary), from the
bundle's tokenizer.json, with the model's vocabulary size (logit rows past the tokenizer's words are
never allowed) and every end id of the model as EOS: the grammar allows those exactly when its text is
complete, and only those once it is. `check(constraint)` validates a grammar without a tokenizer, so a
server answers a bad schema with a 400 before anything is queued.

JSON Schema goes to llguidance's own compiler; its text is laid out on one line, as json.dumps writes it
(JSON_LAYOUT), unless the schema's "x-guidance" options say otherwise. A schema it cannot honour is an
error with llguidance's message. This module never parses JSON output itself and never touches a model.
"""

from __future__ import annotations

import json
import threading

import llguidance
import llguidance.numpy   # not llguidance.torch: it imports torch._dynamo (~120 MB resident, seconds) for a kernel unused here
import numpy as np
import torch
from torch import Tensor

from speczoo.request import Constraint
from speczoo.tokenizer import Tokenizer

KINDS = ("json_schema", "lark")
JSON_OBJECT = '{"type": "object"}'     # OpenAI's response_format json_object: any JSON object
# JSON on one line with Python's json.dumps separators: free whitespace lets a small model loop on newlines
# until max_tokens. A schema's own "x-guidance" options (llguidance's) override these.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def compile_grammar(constraint: Constraint) -> str:
    """llguidance's grammar text of a constraint; ValueError with llguidance's message when it is invalid."""
    if constraint.kind == "json_schema":
        try:
            json.loads(constraint.source)
        except ValueError as exc:
            raise ValueError(f"invalid JSON schema: it is not JSON ({exc})") from None
        grammar = llguidance.LLMatcher.grammar_from_json_schema(constraint.source, defaults=JSON_LAYOUT)
    elif constraint.kind == "lark":
        grammar = llguidance.LLMatcher.grammar_from_lark(constraint.source)
    else:
        raise ValueError(f"unknown constraint kind {constraint.kind!r}: use one of {list(KINDS)}")
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ValueError(f"invalid {'JSON schema' if constraint.kind == 'json_schema' else 'grammar'}: {error}")
    return grammar


def check(constraint: Constraint) -> None:
    """Raise ValueError (llguidance's message) unless the constraint compiles."""
    compile_grammar(constraint)


class TokenGrammar:
    """One generation's llguidance matcher as a decoding/constraint.py Grammar over `vocab_size` logits."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size
        self._bits = llguidance.numpy.allocate_token_bitmask(1, vocab_size)     # [1, W = ceil(V / 32)] int32

    def allowed(self) -> Tensor:
        """[V] bool: bit j of word w allows token 32 w + j (little-endian words: byte 4 w + j // 8, bit j % 8;
        numpy unpacks them in about 0.1 ms at V = 152k, where torch's shifts take tens)."""
        llguidance.numpy.fill_next_token_bitmask(self.matcher, self._bits, 0)
        self._raise_if_error()
        bits = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")     # [32 W] uint8
        return torch.from_numpy(bits[:self.vocab_size].view(np.bool_))

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise ValueError(f"the grammar does not allow token {token} here: {self.matcher.get_error()}")

    def rollback(self, n: int) -> None:
        if n and not self.matcher.rollback(n):
            raise ValueError(f"the grammar cannot roll back {n} tokens: {self.matcher.get_error()}")

    def _raise_if_error(self) -> None:
        if self.matcher.is_error():
            raise ValueError(f"the grammar failed: {self.matcher.get_error()}")


class Grammars:
    """The grammar factory of one model: its tokenizer's llguidance twin, built once, and a matcher per
    generation. tokenizer: the bundle's; vocab_size: the model's logits width (>= the tokenizer's words)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._lltokenizer is None:
                self._lltokenizer = llguidance.LLTokenizer(self.tokenizer.backend.to_str(), n_vocab=self.vocab_size,
                                                           eos_token=list(self.tokenizer.eos_ids))
            return self._lltokenizer

    def __call__(self, constraint: Constraint) -> TokenGrammar:
        matcher = llguidance.LLMatcher(self.lltokenizer, compile_grammar(constraint), log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid grammar for this model's tokenizer: {matcher.get_error()}")
        return TokenGrammar(matcher, self.vocab_size)
