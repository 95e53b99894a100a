"""Build, cache and call the compiled CPU kernels (cpu_kernels.cpp, cpu_block.cpp) through ctypes.

The library is compiled on first use with the system C++ compiler (g++ -O3 -march=native -fopenmp)
into speczoo.paths.home()/kernels, keyed by a hash of the sources, the flags and the CPU's feature flags,
so an edited source or another CPU never loads a stale or illegal binary. It links libgomp.so.1, which
is the OpenMP runtime torch has already loaded, so the kernels share torch's thread pool instead of
fighting it. This module must never fall back silently: a missing compiler or a failed build is a
KernelBuildError that says what to install or which backend to use instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch  # noqa: F401  (imported first so its libgomp is the one the kernels bind to)

from speczoo import paths
from speczoo.errors import SpeczooError

SOURCES = tuple(Path(__file__).with_name(n) for n in ("cpu_kernels.cpp", "cpu_block.cpp"))
HEADERS = (Path(__file__).with_name("cpu_kernels.h"),)
BASE_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC")
ARCH_NATIVE = ("-march=native",)
ARCH_PORTABLE = ("-march=x86-64-v2",)  # no AVX-512: exercises the scalar path of the same source
ABI_VERSION = 6

_P = ctypes.c_void_p
_I = ctypes.c_int64


class KernelBuildError(SpeczooError):
    """The compiled CPU kernels could not be built or loaded."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def _compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    found = shutil.which(cxx)
    if found is None:
        raise KernelBuildError(
            f"the q4/q8 CPU kernels need a C++ compiler with OpenMP, and {cxx!r} is not on PATH; "
            "install one (Debian/Ubuntu: apt-get install g++) or set CXX, "
            "or use the pure-PyTorch backend 'q8_torch' (same stored weights as 'q8', slower)"
        )
    return found


def _build(arch: tuple[str, ...]) -> Path:
    cxx = _compiler()
    flags = BASE_FLAGS + arch
    key = hashlib.sha256()
    for part in (*(f.read_bytes() for f in SOURCES + HEADERS), " ".join(flags).encode(), cxx.encode(),
                 _cpu_flags().encode()):
        key.update(part)
    out_dir = paths.home() / "kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"cpu_kernels-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [cxx, *flags, *(str(f) for f in SOURCES), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise KernelBuildError(
                f"compiling the CPU kernels failed ({' '.join(cmd)}):\n{proc.stderr.strip()[-2000:]}\n"
                "fix the toolchain, or use the pure-PyTorch backend 'q8_torch'"
            )
        os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


class NativeKernels:
    """The loaded library: q8_linear / q4_linear write y[S, N] for x[S, K] (fp32, unit column stride);
    attend writes out[S, H, Dh] from q[S, H, Dh] and a layer's K/V cache (see kernels/attention.py)."""

    def __init__(self, path: Path):
        self.path = path
        lib = ctypes.CDLL(str(path))
        if lib.sz_abi_version() != ABI_VERSION:
            raise KernelBuildError(f"{path} has ABI {lib.sz_abi_version()}, expected {ABI_VERSION}; delete it and retry")
        self.has_vnni = bool(lib.sz_has_vnni())
        self._q8 = lib.sz_q8_linear
        self._q8.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q8.restype = ctypes.c_int
        self._q4 = lib.sz_q4_linear
        self._q4.argtypes = [_P, _I, _I, _I, _P, _P, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q4.restype = ctypes.c_int
        self._attend = lib.sz_attend
        self._attend.argtypes = [_P, _I, _I, _I, _P, _P, _I, _I, _P, _P, _P, _P, _P, ctypes.c_int]
        self._attend.restype = ctypes.c_int
        self._blocks = lib.sz_qwen_blocks
        self._blocks.argtypes = [_P, _I, _I, _I, _P, ctypes.c_float, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _P, _P, _P,
                                 ctypes.c_int]
        self._blocks.restype = ctypes.c_int

    @property
    def q8_fn(self):  # (x, S, K, ldx, w8, sw, N, bias, y, nthreads) -> 0, or -1 when scratch allocation failed
        return self._q8

    @property
    def q4_fn(self):  # (x, S, K, ldx, qs, sc, mn, dd, N, bias, y, nthreads) -> 0, or -1 as above
        return self._q4


    @property
    def attend_fn(self):  # (q, S, H, Dh, k, v, Hkv, C, lo, hi, off, idx, out, nthreads) -> 0, -1 (memory), -2 (bad plan)
        return self._attend

    @property
    def blocks_fn(self):  # (x, S, D, n, layers [n, 5], eps, cos_k, sin_k, cos_q, sin_q, H, Hkv, Dh, C, l0, lo, hi,
        #                    off, idx, nthreads) -> 0, -1 (memory), -2 (bad plan), -3 (bad shapes);
        #                    layers: norm1, norm2, lin (4 x 8 linear descriptors), k, v per block
        return self._blocks


_LOADED: dict[tuple[str, ...], NativeKernels] = {}
_LOCK = threading.Lock()


def kernels(arch: tuple[str, ...] = ARCH_NATIVE) -> NativeKernels:
    """The compiled kernels for `arch` (built on first use, then cached on disk and in memory)."""
    with _LOCK:
        if arch not in _LOADED:
            _LOADED[arch] = NativeKernels(_build(arch))
        return _LOADED[arch]
