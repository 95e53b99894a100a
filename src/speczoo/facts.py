"""What a served model is, as a catalogue shows it (Ollama's /api/tags, /api/show): plain data.

`Runtime.facts()` fills one from the bundle it loaded; the server only reads it. Never imports anything
of speczoo.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFacts:
    arch: str                 # the GGUF architecture ("qwen2", "llama", ...)
    quantization: str         # the source's quantization as its publisher names it ("Q4_K_M"), or its main tensor type
    size: int                 # bytes of the source (the GGUF)
    digest: str               # "sha256:<hex>" of the source
    modified: str             # when the bundle was made (ISO 8601, UTC)
    context: int              # the longest prompt + answer this server takes (--max-seq)
    chat_template: str        # the Jinja chat template the prompts are rendered with ("" when none)
