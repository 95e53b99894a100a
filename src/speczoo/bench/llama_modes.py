"""llama-server's decoding modes as the benches start them: a mode's name → its command-line flags.

* `greedy`: no speculation (the reference every other mode is judged against);
* `ngram-mod`: `--spec-type ngram-mod`, llama.cpp's rolling-hash n-gram drafter whose pool is shared
  across requests, at its default sizes (n-match 24, n-min 48, n-max 64);
* `ngram-simple`: `--spec-type ngram-simple`, the last matching n-gram's continuation, at its default
  sizes (size-n 12, size-m 48);
* `draft`: `--spec-type draft-simple -md DRAFT.gguf --spec-draft-n-max N`, with N = 7 by default:
  llama.cpp's own recipe for a draft model (examples/speculative-simple/README.md runs draft-simple with
  `--spec-draft-n-max 7`; the server's built-in default is 3), the draft on the same threads.

This module never starts a server (serve_load_llama.LlamaServer does) and never picks sizes of its own
for the n-gram modes: they run as llama.cpp ships them.
"""

from __future__ import annotations

from pathlib import Path

MODES = ("greedy", "ngram-mod", "ngram-simple", "draft")
DRAFT_N_MAX = 7           # llama.cpp's draft-simple recipe (examples/speculative-simple/README.md)
NGRAM_N_MAX = 64          # the longest draft an n-gram mode makes at its defaults (ngram-mod's n-max)


def default_modes(has_draft: bool) -> str:
    """Every mode, `draft` only where there is a draft model."""
    return ",".join(m for m in MODES if m != "draft" or has_draft)


def parse_modes(spec: str, has_draft: bool) -> list[str]:
    """ "greedy,ngram-mod,draft" → the modes, greedy first (the reference of the others, required)."""
    modes = list(dict.fromkeys(m.strip() for m in spec.split(",") if m.strip()))
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown llama-server mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    if "greedy" not in modes:
        raise ValueError("--llama-modes must include greedy (the reference of llama-server's other modes)")
    if "draft" in modes and not has_draft:
        raise ValueError("the llama-server draft mode needs a draft model: the target has no zoo draft, so "
                         "pass --draft NAME or leave draft out of --llama-modes")
    return ["greedy"] + [m for m in modes if m != "greedy"]


def mode_args(mode: str, threads: int, draft_gguf: Path | None = None, draft_max: int = DRAFT_N_MAX) -> list[str]:
    """llama-server's flags for a mode (besides the ones every start has: serve_load_llama.LlamaServer)."""
    if mode == "greedy":
        return []
    if mode in ("ngram-mod", "ngram-simple"):
        return ["--spec-type", mode]
    if mode == "draft":
        if draft_gguf is None:
            raise ValueError("the llama-server draft mode needs a draft model's GGUF")
        t = str(threads)
        return ["--spec-type", "draft-simple", "-md", str(draft_gguf), "--spec-draft-n-max", str(draft_max),
                "-td", t, "-tbd", t]
    raise ValueError(f"unknown llama-server mode {mode!r}; choose from {', '.join(MODES)}")
