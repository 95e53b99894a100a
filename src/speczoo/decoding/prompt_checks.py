"""What a prompt must satisfy before a generation starts: it fits the context, and its ids are tokens.

One check each, shared by the engine, the runtime, the server, the chat and the A/B bench, so every
caller refuses the same prompts with the same words; a caller only adds its own remedy (a server is
restarted, a command takes --max-seq) or turns the error into its own (an HTTP 400). Pure arithmetic
over lengths and ids: this module never sees a model or a cache.
"""

from __future__ import annotations

from collections.abc import Iterable

from speczoo.errors import CacheFullError


def fits(prompt_tokens: int, new_tokens: int, max_seq: int) -> bool:
    """Whether a prompt of `prompt_tokens` plus `new_tokens` (at least one) to generate fit `max_seq`."""
    return new_tokens >= 1 and prompt_tokens + new_tokens <= max_seq


def check_fits(prompt_tokens: int, new_tokens: int, max_seq: int, *, new_name: str = "max_new_tokens",
               remedy: str = "raise --max-seq") -> None:
    """CacheFullError unless `fits`: the message names both lengths, the context and what to do
    (`new_name`: what the caller calls the tokens to generate; `remedy`: how its user raises the context)."""
    if not fits(prompt_tokens, new_tokens, max_seq):
        raise CacheFullError(f"the prompt ({prompt_tokens} tokens) plus {new_name} ({new_tokens}) exceeds the "
                             f"context of {max_seq} tokens: shorten the prompt, lower {new_name}, or {remedy}")


def check_ids(ids: Iterable[int], vocab_size: int, model: str) -> None:
    """ValueError naming the first id outside `model`'s vocabulary (0 .. vocab_size - 1)."""
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token id {bad} is outside the vocabulary of {model} (0..{vocab_size - 1})")
