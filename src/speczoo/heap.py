"""Give the C heap's free memory back to the system once a load's temporary allocations are freed.

glibc's malloc keeps the pages of freed small allocations for reuse, so a process's resident memory stays
at its load-time high point: the tokenizer's JSON parse (tokenizers, in Rust) frees ~50 MB of parse
state for a 150k vocabulary that would otherwise stay resident for the life of the process.
`release_free_heap()` asks glibc to return it (malloc_trim(0)); it frees nothing in use and changes no
value. A C library without malloc_trim (musl, macOS) keeps its own policy, and this does nothing there.
This module never allocates or frees anything itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap() -> bool:
    """Return the C heap's free pages to the system; whether the C library could (glibc's malloc_trim)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
