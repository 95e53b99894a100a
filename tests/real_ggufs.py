"""The real GGUF files the tokenizer and chat-template tests read: the source GGUFs of the zoo's small
pulled models (tests/real_models.py; .ci/run pulls them), one per architecture the zoo holds.

    path = real_gguf("smollm2-135m")    # NotPulledError names the pull command when it is missing
"""

from __future__ import annotations

from pathlib import Path

from real_models import GEMMA_NAME, QWEN_NAME, SMOLLM_NAME, gguf_of

NAMES = (SMOLLM_NAME, QWEN_NAME, GEMMA_NAME)


def real_gguf(name: str) -> Path:
    """The verified source GGUF of the pulled zoo model `name` (one of NAMES)."""
    return gguf_of(name)
