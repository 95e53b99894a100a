"""Every instruction-set path of the compiled kernels this CPU can run gives the scalar reference's bits.

Each path is its own build of the same sources (kernels/native.py, flags per path); a CPU that cannot
run a path skips it here, and the torch-free driver (test_kernel_paths_driver.py) covers the Arm paths
under qemu. Compared bit for bit against the scalar build: q8, q4, q40, q50, q80 and the float formats' (f32, f16, bf16)
linears (S in {1, 2, 5, 9, 17}, K off every block size and ending in partial super-blocks, N ending in a
partial strip, bias or not, one and two threads; subnormal weights of each float type), attention over
chains and tree rows (plain and soft-capped), and whole tiny models of the compiled block's shapes and
gemma2's (prefill, decode, chain and tree verifies, and their caches), in q4, q8, q40, f16, bf16 and f32.
Also: how a path is chosen from the CPU's features.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil

import pytest
import torch

from tiny import tiny_args, tiny_tensors, tree_mask

from speczoo.cache import KVCache
from speczoo.kernels import attention, native
from speczoo.kernels.pack import pack_q4, pack_q8
from speczoo.kernels.pack_q40 import pack_q40
from speczoo.kernels.pack_q50 import pack_q50
from speczoo.kernels.pack_q80 import pack_q80
from speczoo.kernels.pack_q6 import pack_q6
from speczoo.kernels.quantized import (FloatBackend, Q4Backend, Q6Backend, Q8Backend, Q40Backend, Q50Backend,
                                      Q80Backend)
from speczoo.models.forward import Tree
from speczoo.models.registry import arch_class

PATHS = [p for p in native.runnable_paths() if p.simd]
S_VALUES = (1, 2, 5, 9, 17)
SHAPES = ((17, 33), (40, 200), (33, 600), (24, 896), (50, 1000), (16, 1536))


def _path_ids(paths):
    return [p.name for p in paths]


@pytest.fixture(scope="module")
def scalar():
    return native.scalar_path()


@contextlib.contextmanager
def _setting(get, put, value):
    """`put(value)` for the block, then what `get()` gave before it back."""
    saved = get()
    put(value)
    try:
        yield
    finally:
        put(saved)


def _threads(n: int):
    return _setting(torch.get_num_threads, torch.set_num_threads, n)


def _one_row_prefetch(on: bool):
    return _setting(native.one_row_prefetch, native.set_one_row_prefetch, on)


def _float(fmt: str):
    return lambda path=None: FloatBackend(fmt, path)


FAMILIES = {"q8": (Q8Backend, pack_q8), "q4": (Q4Backend, pack_q4), "q40": (Q40Backend, pack_q40),
            "q50": (Q50Backend, pack_q50), "q80": (Q80Backend, pack_q80),
            **{f: (_float(f), FloatBackend(f).pack) for f in ("f32", "f16", "bf16")}}
# the smallest magnitudes each float format stores, subnormals included (0 for the integer formats)
TINY = {"f16": (2.0 ** -24, 6.0e-5), "bf16": (1.0e-40, 1.0e-38), "f32": (1.0e-45, 1.0e-39)}


@pytest.mark.parametrize("path", PATHS, ids=_path_ids(PATHS))
@pytest.mark.parametrize("fam", list(FAMILIES))
def test_linears_equal_the_scalar_path(path, fam, scalar):
    backend, pack = FAMILIES[fam]
    g = torch.Generator().manual_seed(3)
    for n, k in SHAPES:
        w = torch.randn(n, k, generator=g) * 0.05
        if fam in TINY:                                # subnormal weights: the conversions must keep them
            w[0, ::3] = torch.tensor(TINY[fam]).repeat(k)[: w[0, ::3].numel()]
        packed = pack(w)
        for bias in (torch.randn(n, generator=g), None):
            ref_mod, mod = backend(scalar).build(packed, bias), backend(path).build(packed, bias)
            for s in S_VALUES:
                x = torch.randn(s, k, generator=g)
                x[:, : max(1, k // 50)] *= 20.0
                ref = ref_mod(x)
                for threads in (1, 2):
                    with _threads(threads):
                        y = mod(x)
                    assert torch.equal(y, ref), f"{path.name} {fam} N={n} K={k} S={s} threads={threads}"


@pytest.mark.parametrize("path", PATHS, ids=_path_ids(PATHS))
def test_attention_equals_the_scalar_path(path, scalar):
    lib, ref_lib = native.kernels(path), native.kernels(scalar)
    g = torch.Generator().manual_seed(4)
    rows = [(0, 20 + i) for i in range(5)] + [torch.tensor([0, 1, 2, 40, 41]), torch.tensor([3, 42]), (7, 60),
                                              (0, 150), (3, 133)]   # past one block of values (64 keys)
    keys = attention.KeyRows.from_rows(rows)
    # G = 4: Llama 3's; Dh 256: Gemma 2's, the widest head whose keys AVX-512 widens once a tile; 272: past it
    for h, hkv, dh in ((14, 2, 64), (12, 2, 128), (4, 4, 16), (8, 2, 40), (8, 2, 128), (4, 2, 256), (2, 1, 272)):
        q = torch.randn(len(rows), h, dh, generator=g)
        kc, vc = torch.randn(hkv, 160, dh, generator=g) * 3, torch.randn(hkv, 160, dh, generator=g)
        for (k, v), softcap in itertools.product(((kc, vc), (kc.half(), vc.half())), (0.0, 50.0, 3.0)):
            ref = attention.attend(q, k, v, keys, lib=ref_lib, softcap=softcap)   # caps: both tanh branches
            for threads in (1, 2):
                with _threads(threads):
                    out = attention.attend(q, k, v, keys, lib=lib, softcap=softcap)
                assert torch.equal(out, ref), (f"{path.name} H={h} Hkv={hkv} Dh={dh} cap={softcap} {k.dtype} "
                                               f"threads={threads}")


def _forwards(model, args, kv_dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Prefill, a decode step, a chain verify of 5 and a tree verify of 4: logits and the caches."""
    toks = torch.randint(0, args.vocab_size, (30,), generator=torch.Generator().manual_seed(5))
    c = KVCache(args, 64, dtype=kv_dtype)
    outs = [model(toks[:20], torch.arange(20), c).logits, model(toks[20:21], torch.tensor([20]), c).logits,
            model(toks[21:26], torch.arange(21, 26), c).logits,
            model(toks[26:30], torch.tensor([26, 27, 28, 27]), c, attend=Tree(tree_mask([-1, 0, 1, 0]))).logits]
    return outs + [c._k.clone(), c._v.clone()]


@pytest.mark.parametrize("path", PATHS, ids=_path_ids(PATHS))
@pytest.mark.parametrize("backend", (Q4Backend, Q8Backend, Q40Backend, _float("f16"), _float("bf16"), _float("f32")),
                         ids=("q4", "q8", "q40", "f16", "bf16", "f32"))
@pytest.mark.parametrize("arch", ("qwen2", "qwen3", "phi3", "gemma2"))   # bias, QK norm, fused tensors, soft-caps
def test_whole_model_equals_the_scalar_path(path, backend, arch, scalar):
    args = tiny_args(arch)
    tensors = tiny_tensors(args)
    cls = arch_class(arch)
    model, ref = cls(args, tensors, backend(path)), cls(args, tensors, backend(scalar))
    compiled = model.layers[0].native is not None
    assert compiled == (arch != "gemma2"), "the compiled block should run on this path (gemma2's blocks: PyTorch)"
    for a, b in zip(_forwards(model, args), _forwards(ref, args), strict=True):
        assert torch.equal(a, b), path.name


ALL_PATHS = [native.scalar_path(), *PATHS]


@pytest.mark.parametrize("path", ALL_PATHS, ids=_path_ids(ALL_PATHS))
def test_the_one_row_prefetch_changes_no_bit(path, scalar):
    """The one-row prefetch (a cost profile's per-machine choice) changes the time only: one-row q4 and q6
    linears with it give the bits they give without, and a whole q4 model the scalar path's bits."""
    g = torch.Generator().manual_seed(6)
    for backend, pack in ((Q4Backend, pack_q4), (Q6Backend, pack_q6)):
        for n, k in SHAPES:
            mod = backend(path).build(pack(torch.randn(n, k, generator=g) * 0.05), None)
            x = torch.randn(1, k, generator=g)
            with _one_row_prefetch(False):
                off = mod(x)
            with _one_row_prefetch(True):
                assert native.kernels(path).one_row_prefetch
                on = mod(x)
            assert torch.equal(on, off), f"{path.name} {backend.name} N={n} K={k}"
    args = tiny_args("qwen2")
    tensors = tiny_tensors(args)
    cls = arch_class("qwen2")
    model, ref = cls(args, tensors, Q4Backend(path)), cls(args, tensors, Q4Backend(scalar))
    model.one_row_prefetch = True                     # set on the kernels by each of its forwards
    with _one_row_prefetch(False):                    # and put back after them
        for a, b in zip(_forwards(model, args), _forwards(ref, args), strict=True):
            assert torch.equal(a, b), path.name


@pytest.mark.parametrize("path", PATHS, ids=_path_ids(PATHS))
@pytest.mark.parametrize("arch", ("qwen2", "gemma2"))      # the compiled block, and PyTorch's blocks
def test_whole_model_over_an_fp16_cache_equals_the_scalar_path(path, arch, scalar):
    args = tiny_args(arch)
    tensors = tiny_tensors(args)
    cls = arch_class(arch)
    model, ref = cls(args, tensors, Q4Backend(path)), cls(args, tensors, Q4Backend(scalar))
    for a, b in zip(_forwards(model, args, torch.float16), _forwards(ref, args, torch.float16), strict=True):
        assert torch.equal(a, b), path.name


@pytest.mark.skipif(shutil.which("clang++") is None and os.environ.get("CI") != "true",
                    reason="clang++ is not installed (CI installs it)")
def test_a_clang_build_equals_the_gcc_scalar_path(monkeypatch, scalar):
    """CXX=clang++ builds the chosen path (threaded through libgomp, as torch is) with the same bits."""
    monkeypatch.setenv("CXX", "clang++")
    path = native.runnable_paths()[0]
    lib = native.NativeKernels(native._build(path), path)
    assert lib.threaded and lib.path_name == path.name
    monkeypatch.delenv("CXX")
    w = torch.randn(40, 1000, generator=torch.Generator().manual_seed(6)) * 0.05
    x = torch.randn(9, 1000, generator=torch.Generator().manual_seed(7))
    for backend, pack in ((Q4Backend, pack_q4), (Q8Backend, pack_q8)):
        packed = pack(w)
        ref = backend(scalar).build(packed, None)(x)
        mod = backend(scalar).build(packed, None)
        mod.lib, mod._fn = lib, (lib.q4_fn if backend is Q4Backend else lib.q8_fn)
        assert torch.equal(mod(x), ref)


# ------------------------------------------------------------------------------------------ choosing a path
ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nphysical id\t: 0\ncore id\t: 0\nflags\t\t: fpu sse2 ssse3 " \
       "sse4_1 sse4_2 avx avx2 fma bmi1 bmi2 f16c movbe abm popcnt\nprocessor\t: 1\nphysical id\t: 0\ncore id\t: 0\n"
SPR = ZEN3.replace("AMD EPYC 7B13", "Intel Xeon").replace(
    "popcnt", "popcnt avx512f avx512bw avx512cd avx512dq avx512vl avx512_vnni avx_vnni")
ADL = ZEN3.replace("popcnt", "popcnt avx_vnni")
OLD = "processor\t: 0\nmodel name\t: Old\nflags\t\t: fpu sse2 ssse3 sse4_1 sse4_2 avx popcnt\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid asimddp i8mm\nCPU part\t: 0xd0c\n"
PI4 = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n"


@pytest.mark.parametrize("text,arch,best", [(ZEN3, "x86_64", "avx2"), (SPR, "x86_64", "avx512vnni"),
                                            (ADL, "x86_64", "avxvnni"), (OLD, "x86_64", "scalar"),
                                            (ARM, "aarch64", "i8mm"), (PI4, "aarch64", "neon")])
def test_the_best_path_comes_from_the_cpu_features(text, arch, best):
    info = native.parse_cpuinfo(text, arch)
    assert native.runnable_paths(info)[0].name == best
    assert native.runnable_paths(info)[-1].name == "scalar"


def test_cores_are_counted_without_hyperthreads():
    info = native.parse_cpuinfo(ZEN3, "x86_64")
    assert (info.physical_cores, info.logical_cores, info.model) == (1, 2, "AMD EPYC 7B13")


def test_a_forced_path_is_refused_when_the_cpu_lacks_it(monkeypatch):
    zen3 = native.parse_cpuinfo(ZEN3, "x86_64")
    with pytest.raises(native.KernelBuildError, match="avx512_vnni"):
        native.path_named("avx512vnni", zen3)
    with pytest.raises(native.KernelBuildError, match="unknown kernel path"):
        native.path_named("sse9", zen3)
    monkeypatch.setenv(native.PATH_ENV, "scalar")
    assert native.chosen_path() == native.scalar_path()


def test_the_library_reports_the_path_it_was_built_for(scalar):
    assert native.kernels(scalar).path_name == "scalar"
    for path in PATHS:
        assert native.kernels(path).path_name == path.name


def test_landing_on_the_scalar_path_is_said_once(monkeypatch, capsys, scalar):
    monkeypatch.delenv(native.PATH_ENV, raising=False)
    monkeypatch.setattr(native, "_WARNED", set())
    monkeypatch.setattr(native, "chosen_path", lambda: scalar)
    native.kernels()
    native.kernels()
    err = capsys.readouterr().err
    assert err.count("scalar reference path") == 1 and "speczoo doctor" in err
    native.kernels(scalar)                              # a path asked for by name is not a surprise
    assert "scalar" not in capsys.readouterr().err


def test_the_build_id_follows_the_sources_and_the_path(tmp_path, monkeypatch):
    """A cost profile is keyed by it (decoding/pricing/profile.py): new kernel sources, another id."""
    src = tmp_path / "k.cpp"
    src.write_text("int f() { return 1; }\n")
    monkeypatch.setattr(native, "SOURCES", (src,))
    monkeypatch.setattr(native, "HEADERS", ())
    scalar, before = native.scalar_path(), native.build_id(native.scalar_path())
    assert len(before) == 16 and native.build_id(scalar) == before
    src.write_text("int f() { return 2; }\n")
    assert native.build_id(scalar) != before
    assert native.build_id(native.path_named("avx2", native.parse_cpuinfo(ZEN3, "x86_64"))) != native.build_id(scalar)
