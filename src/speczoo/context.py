"""How long a context a runtime holds, and in what its keys and values are stored.

`--max-seq` defaults to the model's own context length (its GGUF's `context_length`), capped so that the
KV caches of one sequence (the target's, and a draft model's beside it) take at most KV_MEMORY_SHARE of
the memory available once the weights are loaded; `choose_max_seq` returns the length and the one line
that says which cap applied. `--kv-type` names the cache's element type: f16 (the default, as llama.cpp
stores it: half the memory, each value rounded once when its row is written) or f32. Pure arithmetic
over numbers it is given, plus a read of /proc/meminfo; this module must never allocate a cache or load
a model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from speczoo.models.args import ModelArgs

KV_TYPES: dict[str, torch.dtype] = {"f16": torch.float16, "f32": torch.float32}
DEFAULT_KV_TYPE = "f16"     # llama.cpp's default; its perplexity against f32: docs/results.md "16-bit KV cache"
KV_MEMORY_SHARE = 0.5       # the most of the available memory one sequence's KV caches may take by default
MAX_SEQ_STEP = 256          # a memory-capped length is rounded down to a multiple of this


def kv_dtype(name: str) -> torch.dtype:
    """The torch dtype of a --kv-type name; a ValueError naming the choices for any other."""
    try:
        return KV_TYPES[name]
    except KeyError:
        raise ValueError(f"--kv-type must be one of {', '.join(KV_TYPES)}, got {name!r}") from None


def kv_bytes_per_token(args: ModelArgs, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token takes in a model's cache (every attention layer, K and V; a hybrid's
    convolution layers keep a fixed few rows per sequence instead, models/conv_rows.py)."""
    return 2 * len(args.kv_layers) * args.n_kv_heads * args.head_dim * torch.tensor([], dtype=dtype).element_size()


def available_memory() -> int:
    """Bytes of memory available to new allocations: Linux's MemAvailable, else the free pages."""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ContextChoice:
    """The context a runtime holds (prompt + output, in tokens) and the line that says why."""

    max_seq: int
    reason: str


def choose_max_seq(requested: int | None, context_length: int, per_token: int, available: int,
                   kv_type: str = DEFAULT_KV_TYPE) -> ContextChoice:
    """requested: --max-seq (None: choose); context_length: the model's own; per_token: the KV bytes of one
    token over every cache a sequence fills (kv_bytes_per_token, summed); available: bytes free after the
    weights are loaded. A ValueError when the request is below 2 or memory cannot hold even a short
    context."""
    if requested is not None:
        if requested < 2:
            raise ValueError(f"--max-seq must be at least 2, got {requested}")
        beyond = (f"; beyond the model's own context of {context_length}, where it was not trained"
                  if requested > context_length else "")
        return ContextChoice(requested, f"--max-seq {requested} as given (KV {kv_type}, "
                                        f"{_mib(requested * per_token)} per sequence){beyond}")
    if per_token <= 0 or context_length < 2:
        raise ValueError(f"cannot size the KV cache: {per_token} bytes per token, a context of {context_length}")
    fits = int(KV_MEMORY_SHARE * available) // per_token
    if fits >= context_length:
        return ContextChoice(context_length, f"--max-seq {context_length}: the model's own context length (KV "
                                             f"{kv_type}, {_mib(context_length * per_token)} per sequence)")
    capped = fits // MAX_SEQ_STEP * MAX_SEQ_STEP
    if capped < MAX_SEQ_STEP:
        raise ValueError(f"only {available / 2**30:.2f} GiB of memory is available after loading the weights, too "
                         f"little for a KV cache of {MAX_SEQ_STEP} tokens ({_mib(MAX_SEQ_STEP * per_token)}, "
                         f"KV {kv_type}); free memory, or give a smaller --max-seq")
    return ContextChoice(capped, f"--max-seq {capped}: capped by memory ({KV_MEMORY_SHARE:.0%} of the "
                                 f"{available / 2**30:.1f} GiB available holds {_mib(capped * per_token)} of KV "
                                 f"{kv_type}); the model's own context is {context_length}; set --max-seq to choose")


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"
