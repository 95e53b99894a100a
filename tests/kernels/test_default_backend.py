"""The backend a model loads with by default (runtime.default_backend): the bundle's packing on a CPU the
kernels have a SIMD path for; on one without, the fastest batch-invariant packing the bundle stores, and a
note on stderr when a faster one could be stored; a bundle that stores none (pulled with `--backend fp32`)
loads with the backend that packs at load."""

import pytest

from speczoo import runtime
from speczoo.kernels import native
from speczoo.kernels.backends import LOAD_TIME_BACKEND, get_backend
from speczoo.zoo.bundle import Manifest, SourceInfo

SIMD = native.KernelPath("avx2", "x86_64", ("-march=x86-64-v3",), frozenset({"avx2"}), True)
SCALAR = native.KernelPath("scalar", "x86_64", ("-march=x86-64", "-DSZ_SCALAR"), frozenset(), False)


def bundle(tmp_path, packed: list[str]):
    d = tmp_path / "-".join(packed or ["none"])
    d.mkdir()
    Manifest(name=d.name, source=SourceInfo("gguf", "/x.gguf", "0" * 64, 1), architecture="qwen2",
             quantization={}, packed_backends=packed, created="2026-01-01T00:00:00+00:00").write(d)
    return d


@pytest.fixture
def path(monkeypatch):
    chosen = {"path": SIMD}
    monkeypatch.setattr(native, "chosen_path", lambda: chosen["path"])
    monkeypatch.setattr(runtime, "_NOTED", set())
    return chosen


def test_simd_cpu_loads_the_bundles_packing(tmp_path, path):
    assert runtime.default_backend(bundle(tmp_path, ["q4"])) == "q4"
    assert runtime.default_backend(bundle(tmp_path, ["q4", "q8"])) == "q4"


def test_scalar_cpu_loads_the_fastest_stored_packing_there(tmp_path, path):
    path["path"] = SCALAR
    assert runtime.default_backend(bundle(tmp_path, ["q4", "q8"])) == "q8"
    assert runtime.default_backend(bundle(tmp_path, ["q4", "q8_torch"])) == "q8_torch"
    assert runtime.default_backend(bundle(tmp_path, ["q4"])) == "q4"
    assert all(get_backend(b).batch_invariant for b in runtime.NO_SIMD_BACKENDS)


def test_a_slower_default_on_a_scalar_cpu_says_what_to_pull_once(path, capsys):
    path["path"] = SCALAR
    runtime._note_slow_default("m", "q4")
    runtime._note_slow_default("m", "q4")
    err = capsys.readouterr().err
    assert err.count("speczoo pull m --backend q8") == 1
    runtime._note_slow_default("n", "q8")           # the fastest already: nothing to say
    path["path"] = SIMD
    runtime._note_slow_default("k", "q4")           # a SIMD path: q4 is the fast one
    assert capsys.readouterr().err == ""


def test_a_bundle_storing_no_packing_loads_with_the_load_time_backend(tmp_path, path):
    assert runtime.default_backend(bundle(tmp_path, [])) == LOAD_TIME_BACKEND == "fp32"
    path["path"] = SCALAR
    assert runtime.default_backend(tmp_path / "none") == "fp32"
    assert not get_backend(LOAD_TIME_BACKEND).stored

