"""Options shared by every command that loads a runtime, and which draft model such a command loads.

Not a command itself (the CLI skips modules whose name starts with "_"). It only reads arguments and
the zoo's registry; it never loads a model.
"""

from __future__ import annotations

import argparse

from speczoo.context import DEFAULT_KV_TYPE, KV_TYPES
from speczoo.decoding.drafters.registry import BY_NAME, DRAFT_MODEL
from speczoo.decoding.modes import AUTO, SpecMode, using
from speczoo.decoding.tuning import DRAFTING

# The chat's word for "the best speculative mode there is" (speczoo/chat.py resolves it).
CHAT_ON = "on"


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Options every command that loads a runtime shares."""
    p.add_argument("--draft", default=None, metavar="NAME_OR_PATH",
                   help="draft model for --spec draft/auto: a zoo name, or the path of a GGUF file (or Hugging Face "
                        "directory), pulled on first use; it must share the target's tokenizer (`speczoo check-pair "
                        "DRAFT TARGET`). Default: the zoo's draft for the target, if it has one")
    p.add_argument("--draft-vocab", type=draft_vocab, default=DRAFTING.head_vocab, metavar="N",
                   help="the draft model proposes from a reduced LM head over the N most frequent ids (the first N: "
                        "byte-level BPE ids are in merge order) plus the prompt's own; the target still verifies over "
                        f"its full vocabulary, so the output is unchanged. 0: the full head (default "
                        f"{DRAFTING.head_vocab})")
    p.add_argument("--backend", default=None, help="linear backend (default: the fast batch-invariant one)")
    p.add_argument("--max-seq", type=int, default=None,
                   help="the longest prompt + output in tokens (default: the model's own context length, capped so "
                        "that one sequence's KV cache takes at most half the memory available; one line says which)")
    p.add_argument("--kv-type", choices=sorted(KV_TYPES), default=DEFAULT_KV_TYPE,
                   help=f"element type of the KV cache (default {DEFAULT_KV_TYPE}, as llama.cpp: half the memory of "
                        "f32; each key and value rounded once when written)")
    add_threads_arg(p)


def draft_vocab(text: str) -> int | None:
    """--draft-vocab N: the reduced draft head's common ids (None for 0: the full head)."""
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"--draft-vocab must be >= 0 (0: the full head), got {n}")
    return n or None


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    """--threads: the kernels' and torch's thread count, applied by the CLI before the command runs
    (speczoo/threads.py). The CLI gives every command that does not define it this option."""
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="threads for the kernels and torch (default: $OMP_NUM_THREADS, else the physical cores)")


def draft_for(target: str, spec: str, draft: str | None) -> str | None:
    """The draft model to load for `target`: `draft` (--draft), the NAME of `--spec draft:NAME`, or,
    for --spec draft, auto or on, the zoo's default draft of the target (None when it has none;
    an error for --spec draft, which cannot run without one)."""
    from speczoo.zoo.registry import default_draft

    mode = _parse(spec)
    if mode.draft_model:
        if draft and draft != mode.draft_model:
            raise ValueError(f"--spec {spec} and --draft {draft} name different drafts; give one")
        return mode.draft_model
    if draft:
        return draft
    if mode.mode in using(DRAFT_MODEL):            # modes that may draft with a draft model: load the zoo's
        name = default_draft(target)
        if name is None and mode.mode != AUTO:
            raise ValueError(f"--spec draft needs a draft model and the zoo has none for {target!r}: "
                             f"give --draft NAME or --spec draft:NAME")
        return name
    return None


def spec_mode(spec: str) -> str:
    """The speculative mode of a --spec value, without the draft's name (`draft:NAME` -> `draft`)."""
    return CHAT_ON if spec == CHAT_ON else _parse(spec).mode


def eagle_for(spec: str) -> str | None:
    """The EAGLE head a --spec value names (`eagle:NAME` or `eagle-tree:NAME` -> NAME), else None."""
    return _parse(spec).eagle_head


def serves_by_name_in_batch(spec: str) -> bool:
    """Whether a batch (`--parallel N`) can serve the --spec mode when a request names it: off, auto, and
    the drafters whose descriptor keeps all their state per request."""
    mode = _parse(spec)
    return mode.mode in (AUTO, "off") or BY_NAME[mode.mode].by_name_in_batch


def _parse(spec: str) -> SpecMode:
    """A --spec value as a mode; the chat's "on" loads what "auto" loads."""
    return SpecMode(AUTO) if spec == CHAT_ON else SpecMode.parse(spec)
