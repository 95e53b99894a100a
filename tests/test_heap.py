"""release_free_heap gives freed C-heap pages back to the system: resident memory drops by what was freed."""

import ctypes
import ctypes.util
import platform

import pytest

from speczoo.heap import release_free_heap


def _anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_freed_small_allocations_leave_the_resident_set():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(4000) for _ in range(25_000)]           # ~100 MB of small blocks, below mmap's threshold
    for b in blocks:
        ctypes.memset(b, 1, 4000)
    pin = libc.malloc(64)                                          # above them: free() alone cannot shrink the heap
    for b in blocks:
        libc.free(b)
    before = _anon()
    assert release_free_heap()
    assert before - _anon() > 50 << 20
    libc.free(pin)
