"""Where real-model tests find their weights: the zoo's pulled bundles (.ci/run pulls the small ones).

A missing bundle is a failure that names the pull command, never a silent skip.
"""

from pathlib import Path

from speczoo.zoo.bundle import find_bundle, source_gguf

QWEN_NAME = "qwen2.5-coder-0.5b"
GEMMA_NAME = "gemma-3-270m"
SMOLLM_NAME = "smollm2-135m"
BY_ARCH = {"qwen2": QWEN_NAME, "gemma3": GEMMA_NAME, "llama": SMOLLM_NAME}


def gguf_of(name: str) -> Path:
    """The verified source GGUF of a pulled zoo model (NotPulledError says how to pull it)."""
    return source_gguf(find_bundle(name))


_RUNTIMES: dict[tuple[str, int], object] = {}


def real_runtime(name: str = QWEN_NAME, max_seq: int = 1024):
    """The pulled model `name` loaded as a `speczoo.runtime.Runtime` (no draft, its packed backend),
    once per test session: serve tests share it (it runs one generation at a time, as in the server)."""
    from speczoo.runtime import load_runtime

    key = (name, max_seq)
    if key not in _RUNTIMES:
        _RUNTIMES[key] = load_runtime(name, max_seq=max_seq)
    return _RUNTIMES[key]
