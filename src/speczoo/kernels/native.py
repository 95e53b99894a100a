"""Choose, build, cache and call the compiled CPU kernels (cpu_kernels.cpp, cpu_block.cpp) through ctypes.

The sources hold one arithmetic and several instruction-set paths (scalar reference, AVX2, AVX-VNNI,
AVX-512 VNNI, NEON, NEON dotprod, NEON i8mm; see cpu_simd.h). A path is a set of compiler flags: the
best one the CPU's features allow is chosen from those features (/proc/cpuinfo on Linux, sysctl on
macOS), never guessed, and `SPECZOO_KERNEL_PATH=NAME` forces one (refused when the CPU lacks it). The
library is compiled on first use with the system C++ compiler into speczoo.paths.home()/kernels, keyed
by a hash of the sources, the flags and the compiler, so an edited source or another path never loads a
stale or illegal binary. It links the OpenMP runtime torch has already loaded, so the kernels share
torch's thread pool. This module must never fall back silently: a missing compiler or a failed build is
a KernelBuildError that says what to do, and landing on the scalar path is said once on stderr.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch  # imported first so its OpenMP runtime is the one the kernels bind to

from speczoo import paths
from speczoo.errors import SpeczooError
from speczoo.kernels import cpu_family

SOURCES = tuple(Path(__file__).with_name(n) for n in ("cpu_kernels.cpp", "cpu_block.cpp"))
HEADERS = tuple(Path(__file__).with_name(n) for n in ("cpu_kernels.h", "cpu_simd.h", "cpu_tiles.h", "cpu_float.h"))
BASE_FLAGS = ("-O3", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden")
ABI_VERSION = 16
PATH_ENV = "SPECZOO_KERNEL_PATH"

_P = ctypes.c_void_p
_I = ctypes.c_int64


class KernelBuildError(SpeczooError):
    """The compiled CPU kernels could not be built or loaded."""


# ------------------------------------------------------------------------------------------ the CPU
@dataclass(frozen=True)
class CpuInfo:
    arch: str                    # "x86_64", "aarch64", ... (platform.machine, normalized)
    model: str
    features: frozenset[str]     # /proc/cpuinfo flag names (x86: avx2, avx512_vnni, ...; Arm: asimd, asimddp, i8mm)
    physical_cores: int
    logical_cores: int
    source: str                  # where the features were read
    vendor: str = ""             # cpuid's vendor ("AuthenticAMD", "GenuineIntel"), x86 only
    family: int | None = None    # cpuid's family and model numbers, x86 only (kernels/cpu_family.py names them)
    model_number: int | None = None

    def describe(self) -> str:
        """The model name with its core design and numbers where cpuid gave them: "AMD EPYC, Zen 3 (family 25
        model 1)"."""
        return cpu_family.describe(self.model, self.vendor, self.family, self.model_number)


def _norm_arch(machine: str) -> str:
    m = machine.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def parse_cpuinfo(text: str, arch: str) -> CpuInfo:
    """A CpuInfo from the text of /proc/cpuinfo (x86 "flags", Arm "Features")."""
    feats: set[str] = set()
    model, cores, logical = "", set(), 0
    vendor, numbers = "", {}
    phys = core = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("flags", "Features") and not feats:
            feats = set(value.split())
        elif key == "model name" and not model:
            model = value
        elif key == "vendor_id" and not vendor:
            vendor = value
        elif key in ("cpu family", "model") and key not in numbers and value.isdigit():
            numbers[key] = int(value)
        elif key == "processor":
            logical += 1
            phys = core = None
        elif key == "physical id":
            phys = value
        elif key == "core id":
            core = value
            cores.add((phys, core))
        elif key == "CPU part" and not model:
            model = f"Arm CPU part {value}"
    logical = logical or (os.cpu_count() or 1)
    physical = len(cores) if cores else logical
    return CpuInfo(arch, model or platform.processor() or arch, frozenset(feats), physical, logical, "/proc/cpuinfo",
                   vendor, numbers.get("cpu family"), numbers.get("model"))


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _darwin_info(arch: str) -> CpuInfo:
    feats = {"asimd"} if arch == "aarch64" else set()
    for key, flag in (("hw.optional.arm.FEAT_DotProd", "asimddp"), ("hw.optional.arm.FEAT_I8MM", "i8mm")):
        if _sysctl(key) == "1":
            feats.add(flag)
    if arch == "x86_64":
        feats |= set(_sysctl("machdep.cpu.features").lower().split())
        feats |= set(_sysctl("machdep.cpu.leaf7_features").lower().split())
        feats = {f.replace("avx512vnni", "avx512_vnni").replace("avx1.0", "avx") for f in feats}
    phys = int(_sysctl("hw.physicalcpu") or 0) or (os.cpu_count() or 1)
    logical = int(_sysctl("hw.logicalcpu") or 0) or (os.cpu_count() or 1)
    return CpuInfo(arch, _sysctl("machdep.cpu.brand_string") or arch, frozenset(feats), phys, logical, "sysctl")


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """This machine's CPU: model, features and core counts, read once."""
    arch = _norm_arch(platform.machine())
    if sys.platform == "darwin":
        return _darwin_info(arch)
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text(), arch)
    except OSError:
        n = os.cpu_count() or 1
        return CpuInfo(arch, platform.processor() or arch, frozenset(), n, n, "unknown (no /proc/cpuinfo)")


# ------------------------------------------------------------------------------------------ paths
@dataclass(frozen=True)
class KernelPath:
    name: str
    arch: str
    flags: tuple[str, ...]       # compiler flags that select this path in cpu_simd.h
    needs: frozenset[str]        # CPU features it executes
    simd: bool


_V3 = frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"})   # x86-64-v3
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}            # x86-64-v4

# Best first, per architecture. The scalar path is the reference every other path must equal bit for bit.
PATHS: tuple[KernelPath, ...] = (
    KernelPath("avx512vnni", "x86_64", ("-march=x86-64-v4", "-mavx512vnni"), _V4 | {"avx512_vnni"}, True),
    KernelPath("avxvnni", "x86_64", ("-march=x86-64-v3", "-mavxvnni"), _V3 | {"avx_vnni"}, True),
    KernelPath("avx2", "x86_64", ("-march=x86-64-v3",), _V3, True),
    KernelPath("scalar", "x86_64", ("-march=x86-64", "-DSZ_SCALAR"), frozenset(), False),
    KernelPath("i8mm", "aarch64", ("-march=armv8.2-a+dotprod+i8mm",), frozenset({"asimd", "asimddp", "i8mm"}), True),
    KernelPath("dotprod", "aarch64", ("-march=armv8.2-a+dotprod",), frozenset({"asimd", "asimddp"}), True),
    KernelPath("neon", "aarch64", ("-march=armv8-a",), frozenset({"asimd"}), True),
    KernelPath("scalar", "aarch64", ("-march=armv8-a", "-DSZ_SCALAR"), frozenset(), False),
)


def paths_for(arch: str) -> list[KernelPath]:
    return [p for p in PATHS if p.arch == arch]


def scalar_path(arch: str | None = None) -> KernelPath:
    """The scalar reference path of `arch` (default: this machine); a generic build elsewhere."""
    arch = arch or cpu_info().arch
    for p in paths_for(arch):
        if not p.simd:
            return p
    return KernelPath("scalar", arch, ("-DSZ_SCALAR",), frozenset(), False)


def runnable_paths(info: CpuInfo | None = None) -> list[KernelPath]:
    """Every path this CPU can execute, best first (the scalar path last)."""
    info = info or cpu_info()
    runnable = [p for p in paths_for(info.arch) if p.simd and p.needs <= info.features]
    return runnable + [scalar_path(info.arch)]


def path_named(name: str, info: CpuInfo | None = None) -> KernelPath:
    """The path called `name` on this CPU; a KernelBuildError when it is unknown or the CPU lacks it."""
    info = info or cpu_info()
    known = paths_for(info.arch) or [scalar_path(info.arch)]
    for p in known:
        if p.name == name:
            missing = sorted(p.needs - info.features)
            if missing:
                raise KernelBuildError(f"kernel path {name!r} needs CPU features this CPU ({info.model}) lacks: "
                                       f"{', '.join(missing)}; paths it can run: "
                                       f"{', '.join(q.name for q in runnable_paths(info))}")
            return p
    raise KernelBuildError(f"unknown kernel path {name!r} for {info.arch}; known: {', '.join(p.name for p in known)}")


def chosen_path() -> KernelPath:
    """The path the kernels run: $SPECZOO_KERNEL_PATH when set, else the best the CPU's features allow."""
    forced = os.environ.get(PATH_ENV, "").strip()
    return path_named(forced) if forced else runnable_paths()[0]


# ------------------------------------------------------------------------------------------ the build
def compiler() -> str:
    """The C++ compiler the kernels are built with ($CXX, else g++ or clang++); KernelBuildError if absent."""
    cxx = os.environ.get("CXX", "g++" if sys.platform != "darwin" else "clang++")
    found = shutil.which(cxx)
    if found is None:
        raise KernelBuildError(
            f"the q4/q8 CPU kernels need a C++ compiler, and {cxx!r} is not on PATH; "
            "install one (Debian/Ubuntu: apt-get install g++; macOS: xcode-select --install) or set CXX, "
            "or use the pure-PyTorch backend 'q8_torch' (same stored weights as 'q8', slower)"
        )
    return found


def compiler_description() -> str:
    """The compiler the kernels are built with and its version line."""
    try:
        cxx = compiler()
    except KernelBuildError as err:
        return f"none ({err})"
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"{cxx} ({out.splitlines()[0].strip() if out.strip() else 'version unknown'})"


@functools.lru_cache(maxsize=4)
def _links_openmp(cxx: str) -> bool:
    """Whether `cxx -fopenmp` builds a shared library here (clang needs libomp installed for it)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text("int f(int n) { int s = 0;\n#pragma omp parallel for reduction(+:s)\n"
                       "for (int i = 0; i < n; ++i) s += i; return s; }\n")
        proc = subprocess.run([cxx, "-fopenmp", "-shared", "-fPIC", str(src), "-o", str(Path(tmp) / "p.so")],
                              capture_output=True, text=True)
    return proc.returncode == 0


def _openmp_flags(cxx: str) -> tuple[str, ...]:
    """OpenMP for the build: -fopenmp where the compiler can link it (g++ always; clang with libomp);
    on macOS the libomp torch ships, or Homebrew's. Else none: the kernels then run on one thread, and
    say so once with what to install."""
    if sys.platform != "darwin":
        return ("-fopenmp",) if _links_openmp(cxx) else ("-DSZ_NO_OPENMP",)
    torch_lib = Path(torch.__file__).parent / "lib"
    for lib_dir in (torch_lib, Path("/opt/homebrew/opt/libomp/lib"), Path("/usr/local/opt/libomp/lib")):
        if (lib_dir / "libomp.dylib").exists():
            return ("-Xpreprocessor", "-fopenmp", f"-L{lib_dir}", "-lomp", f"-Wl,-rpath,{lib_dir}")
    return ("-DSZ_NO_OPENMP",)


def build_flags(path: KernelPath, cxx: str) -> tuple[str, ...]:
    return BASE_FLAGS + _openmp_flags(cxx) + path.flags


def build_id(path: KernelPath | None = None) -> str:
    """What the library for `path` (default: the chosen one) is built from, as 16 hex digits: its sources,
    headers, flags and compiler. A new speczoo whose kernels changed gets a new id, so what was timed on the
    old ones (a cost profile) is timed again."""
    path = path or chosen_path()
    cxx = compiler()
    key = hashlib.sha256()
    for part in (*(f.read_bytes() for f in SOURCES + HEADERS), " ".join(build_flags(path, cxx)).encode(),
                 cxx.encode()):
        key.update(part)
    return key.hexdigest()[:16]


def _build(path: KernelPath) -> Path:
    cxx = compiler()
    flags = build_flags(path, cxx)
    out_dir = paths.home() / "kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"cpu_kernels-{path.name}-{build_id(path)}.so"
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [cxx, *flags, *(str(f) for f in SOURCES), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise KernelBuildError(
                f"compiling the CPU kernels ({path.name} path) failed ({' '.join(cmd)}):\n"
                f"{proc.stderr.strip()[-2000:]}\nfix the toolchain, force another path with "
                f"{PATH_ENV}=scalar, or use the pure-PyTorch backend 'q8_torch'"
            )
        os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


class NativeKernels:
    """The loaded library: q8_linear / q8b_linear / q8bm_linear / q40_linear / q50_linear / q80_linear / q6_linear /
    q4_linear / float_linear write y[S, N] for x[S, K] (fp32, unit column stride);
    attend writes out[S, H, Dh] from q[S, H, Dh] and a layer's K/V cache (see kernels/attention.py)."""

    def __init__(self, so: Path, path: KernelPath):
        self.so = so
        self.path = path
        lib = ctypes.CDLL(str(so))
        if lib.sz_abi_version() != ABI_VERSION:
            raise KernelBuildError(f"{so} has ABI {lib.sz_abi_version()}, expected {ABI_VERSION}; delete it and retry")
        lib.sz_path.restype = ctypes.c_char_p
        self.path_name = lib.sz_path().decode()
        if self.path_name != path.name:
            raise KernelBuildError(f"{so} was built for the {path.name} path but its code is the {self.path_name} "
                                   f"path: the compiler ignored {' '.join(path.flags)}; check its version")
        self.threaded = bool(lib.sz_openmp())
        self._q8 = lib.sz_q8_linear
        self._q8.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q8.restype = ctypes.c_int
        self._q8b = lib.sz_q8b_linear
        self._q8b.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q8b.restype = ctypes.c_int
        self._q8bm = lib.sz_q8bm_linear
        self._q8bm.argtypes = [_P, _I, _I, _I, _P, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q8bm.restype = ctypes.c_int
        self._q40 = lib.sz_q40_linear
        self._q40.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q40.restype = ctypes.c_int
        self._q50 = lib.sz_q50_linear
        self._q50.argtypes = [_P, _I, _I, _I, _P, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q50.restype = ctypes.c_int
        self._q80 = lib.sz_q80_linear
        self._q80.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q80.restype = ctypes.c_int
        self._q6 = lib.sz_q6_linear
        self._q6.argtypes = [_P, _I, _I, _I, _P, _P, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q6.restype = ctypes.c_int
        self._float = lib.sz_float_linear
        self._float.argtypes = [_I, _P, _I, _I, _I, _P, _I, _P, _P, ctypes.c_int]
        self._float.restype = ctypes.c_int
        self._q4 = lib.sz_q4_linear
        self._q4.argtypes = [_P, _I, _I, _I, _P, _P, _P, _P, _I, _P, _P, ctypes.c_int]
        self._q4.restype = ctypes.c_int
        self._attend = lib.sz_attend
        self._attend.argtypes = [_P, _I, _I, _I, _P, _P, _I, _I, _I, _P, _P, _P, _P, ctypes.c_float, _P, ctypes.c_int]
        self._attend.restype = ctypes.c_int
        self._blocks = lib.sz_qwen_blocks
        self._blocks.argtypes = [_P, _I, _I, _I, _P, ctypes.c_float, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _P, _P, _P,
                                 _P, _P, ctypes.c_int]
        self._blocks.restype = ctypes.c_int
        self._to_f16 = lib.sz_f32_to_f16
        self._to_f16.argtypes = [_P, _I, _P]
        self._to_f16.restype = None
        self._set_prefetch = lib.sz_set_one_row_prefetch
        self._set_prefetch.argtypes = [ctypes.c_int]
        self._set_prefetch.restype = None
        self._get_prefetch = lib.sz_get_one_row_prefetch
        self._get_prefetch.restype = ctypes.c_int
        self._set_prefetch(int(_ONE_ROW_PREFETCH[0]))

    @property
    def one_row_prefetch(self) -> bool:
        """Whether its one-row tiles prefetch their weights in software (see set_one_row_prefetch)."""
        return bool(self._get_prefetch())

    @property
    def q8_fn(self):  # (x, S, K, ldx, w8, sw, N, bias, y, nthreads) -> 0, or -1 when scratch allocation failed
        return self._q8

    @property
    def q8b_fn(self):  # (x, S, K, ldx, w8, sb, N, bias, y, nthreads) -> 0, or -1 as above
        return self._q8b

    @property
    def q8bm_fn(self):  # (x, S, K, ldx, w8, sb, mb, N, bias, y, nthreads) -> 0, or -1 as above
        return self._q8bm

    @property
    def q40_fn(self):  # (x, S, K, ldx, qs, sd, N, bias, y, nthreads) -> 0, or -1 as above
        return self._q40

    @property
    def q50_fn(self):  # (x, S, K, ldx, qs, qh, sd, N, bias, y, nthreads) -> 0, or -1 as above
        return self._q50

    @property
    def q80_fn(self):  # (x, S, K, ldx, w8, sd, N, bias, y, nthreads) -> 0, or -1 as above
        return self._q80

    @property
    def q6_fn(self):  # (x, S, K, ldx, ql, qh, sc, dd, N, bias, y, nthreads) -> 0, or -1 as above
        return self._q6

    @property
    def float_fn(self):  # (fmt 4 f32 / 5 f16 / 6 bf16, x, S, K, ldx, w, N, bias, y, nthreads) -> 0, -1 as above
        return self._float

    @property
    def q4_fn(self):  # (x, S, K, ldx, qs, sc, mn, dd, N, bias, y, nthreads) -> 0, or -1 as above
        return self._q4

    @property
    def attend_fn(self):  # (q, S, H, Dh, k, v, kvfmt, Hkv, C, lo, hi, off, idx, softcap, out, nthreads) -> 0,
        #                    -1 (memory), -2 (bad plan or kvfmt); kvfmt: KV_FMT[cache dtype]; softcap 0: none
        return self._attend

    @property
    def blocks_fn(self):  # (x, S, D, n, layers [n, 7], eps, cos_k, sin_k, cos_q, sin_q, H, Hkv, Dh, C, kvfmt, l0, dst, lo,
        #                    hi, off, idx, nthreads); dst: [S] cache slots of the rows, or null for l0 + s -> 0, -1 (memory), -2 (bad plan), -3 (bad shapes);
        #                    layers: norm1, norm2, lin (4 x 8 linear descriptors), k, v, q_norm, k_norm (0: none)
        #                    per block
        return self._blocks

    @property
    def to_f16_fn(self):  # (x fp32 [n], n, y fp16 [n]): the rounding the compiled blocks write an fp16 cache with
        return self._to_f16


_LOADED: dict[KernelPath, NativeKernels] = {}
_LOCK = threading.Lock()
_WARNED: set[str] = set()
_ONE_ROW_PREFETCH = [False]     # what every library, loaded now or later, is set to


def set_one_row_prefetch(on: bool) -> None:
    """Make a one-row forward's tiles prefetch their weights in software (on) or leave the stream to the
    hardware prefetchers (off, the default), in every loaded library and those loaded later. Which is faster
    depends on the CPU (a model's cost profile times both: decoding/pricing/one_row.py); no result changes by
    a bit. Call it between forwards, never during one. Cheap when nothing changes: a model sets it before each
    forward (models/base.py)."""
    if on != _ONE_ROW_PREFETCH[0]:
        with _LOCK:
            _ONE_ROW_PREFETCH[0] = on
            for lib in _LOADED.values():
                lib._set_prefetch(int(on))


def one_row_prefetch() -> bool:
    """What set_one_row_prefetch last set (False before any call)."""
    return _ONE_ROW_PREFETCH[0]


def _say_once(key: str, text: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        print(f"speczoo: {text}", file=sys.stderr, flush=True)


def _announce(lib: NativeKernels, forced: bool) -> None:
    if not lib.path.simd and not forced:
        info = cpu_info()
        _say_once("scalar", f"this CPU ({info.model}) has none of the features of the kernels' SIMD paths "
                            "(x86: AVX2 and FMA; Arm: NEON), so the compiled kernels run their scalar reference "
                            "path, many times slower. Run `speczoo doctor` to see what was found; a CPU with "
                            "AVX2 or NEON runs them at full speed.")
    if not lib.threaded:
        _say_once("openmp", "the compiled kernels were built without OpenMP and run on one thread; "
                            "install OpenMP for your compiler (Debian/Ubuntu with clang: apt-get install "
                            "libomp-dev; macOS: brew install libomp), or use g++ (CXX=g++); they rebuild by "
                            "themselves once it links.")


def kernels(path: KernelPath | None = None) -> NativeKernels:
    """The compiled kernels for `path` (default: chosen_path()), built on first use, then cached."""
    forced = path is not None or bool(os.environ.get(PATH_ENV, "").strip())
    path = path or chosen_path()
    with _LOCK:
        if path not in _LOADED:
            _LOADED[path] = NativeKernels(_build(path), path)
        lib = _LOADED[path]
    _announce(lib, forced)
    return lib
