"""Where real-model tests find their weights: the zoo's pulled bundles (.ci/run pulls the small ones).

A missing bundle is a failure that names the pull command, never a silent skip.
"""

from pathlib import Path

from speczoo.zoo.bundle import find_bundle, source_gguf

QWEN_NAME = "qwen2.5-coder-0.5b"
GEMMA_NAME = "gemma-3-270m"
BY_ARCH = {"qwen2": QWEN_NAME, "gemma3": GEMMA_NAME}


def gguf_of(name: str) -> Path:
    """The verified source GGUF of a pulled zoo model (NotPulledError says how to pull it)."""
    return source_gguf(find_bundle(name))
