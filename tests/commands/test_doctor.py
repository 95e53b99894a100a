"""`speczoo doctor`: the CPU and its features, the kernel path, threads, compiler, pulled models and a decode
speed, as text or JSON; every problem it finds is named with what to do and sets the exit status. The
CPU, the kernels and the runtime are stand-ins here, save for one real-model test."""

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from fake_runtime import FakeRuntime

from speczoo import cli, openmp_wait
from speczoo.commands import doctor
from speczoo.kernels import native

FEATURES = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})


@dataclass
class FakeLib:
    path_name: str
    threaded: bool = True


@dataclass
class Machine:
    """What the stand-in kernels report: the path chosen and whether building it works."""

    path: native.KernelPath = field(default_factory=lambda: native.KernelPath(
        "avx2", "x86_64", ("-march=x86-64-v3",), frozenset({"avx2", "fma"}), True))
    build_error: str | None = None


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A Zen-3-like CPU (AVX2, no AVX-512), stand-in kernels, an empty speczoo home, torch's threads kept."""
    m = Machine()
    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path))
    (tmp_path / "bundles").mkdir()
    monkeypatch.delenv("SPECZOO_KERNEL_PATH", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SPECZOO_ADAPTIVE_THREADS", raising=False)
    monkeypatch.setattr(native, "cpu_info", lambda: native.CpuInfo(
        "x86_64", "AMD EPYC 7B13", FEATURES, 2, 4, "/proc/cpuinfo", "AuthenticAMD", 25, 1))
    monkeypatch.setattr(native, "chosen_path", lambda: m.path)
    monkeypatch.setattr(native, "compiler_description", lambda: "/usr/bin/g++ (g++ (Debian 12.2.0-14) 12.2.0)")

    def kernels(path=None):
        if m.build_error:
            raise native.KernelBuildError(m.build_error)
        return FakeLib(m.path.name)

    monkeypatch.setattr(native, "kernels", kernels)
    threads = torch.get_num_threads()
    yield m
    torch.set_num_threads(threads)


def doctor_out(capsys, *argv) -> tuple[int, str]:
    rc = cli.main(["doctor", *argv])
    return rc, capsys.readouterr().out


def test_reports_cpu_features_path_threads_and_compiler(machine, capsys):
    rc, out = doctor_out(capsys, "--no-bench", "--threads", "1")
    assert rc == 0, out
    assert "AMD EPYC 7B13, Zen 3 (family 25 model 1); x86_64, 2 physical cores, 4 logical" in out
    assert "sse4_2 avx avx2 fma f16c" in out and "not found: avx512f" in out and "avx512_vnni" in out
    assert "avx2 path (SIMD; -march=x86-64-v3)" in out and "library built for avx2, OpenMP threads" in out
    assert "g++ (Debian 12.2.0-14) 12.2.0" in out
    assert "threads    1, from --threads; fixed by --threads" in out
    assert f"omp wait   {openmp_wait.state()}" in out
    assert "models     none pulled (speczoo pull qwen2.5-coder-0.5b)" in out
    assert "no problems found" in out and "decode" not in out


def test_threads_default_to_the_physical_cores_and_adapt_unless_fixed(machine, capsys, monkeypatch):
    out = doctor_out(capsys, "--no-bench")[1]
    assert "threads    2, from the physical cores; adapts while generating, 1 to 2," in out
    assert "(--threads N or SPECZOO_ADAPTIVE_THREADS=0 fix it)" in out
    monkeypatch.setenv("SPECZOO_ADAPTIVE_THREADS", "0")
    assert "threads    2, from the physical cores; fixed by SPECZOO_ADAPTIVE_THREADS=0" in doctor_out(
        capsys, "--no-bench")[1]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert "threads    2, from $OMP_NUM_THREADS; fixed by $OMP_NUM_THREADS" in doctor_out(capsys, "--no-bench")[1]


def test_scalar_path_is_a_problem_with_what_to_do(machine, capsys, monkeypatch):
    machine.path = native.KernelPath("scalar", "x86_64", ("-march=x86-64", "-DSZ_SCALAR"), frozenset(), False)
    rc, out = doctor_out(capsys, "--no-bench")
    assert rc == 1
    assert "scalar path (scalar reference" in out and "! the kernels run their scalar reference path" in out
    assert "AVX2 and FMA" in out
    monkeypatch.setenv("SPECZOO_KERNEL_PATH", "scalar")
    rc, out = doctor_out(capsys, "--no-bench")
    assert rc == 1 and "forced by SPECZOO_KERNEL_PATH" in out and "unset it" in out


def test_a_kernel_build_failure_is_reported_not_raised(machine, capsys):
    machine.build_error = "compiling the CPU kernels (avx2 path) failed: no g++"
    rc, out = doctor_out(capsys, "--no-bench")
    assert rc == 1
    assert "FAILED: compiling the CPU kernels (avx2 path) failed: no g++" in out
    assert "! the compiled kernels: compiling" in out


def test_json_report(machine, capsys):
    rc, out = doctor_out(capsys, "--no-bench", "--json")
    report = json.loads(out)
    assert rc == 0
    assert report["cpu"]["model"] == "AMD EPYC 7B13" and "avx2" in report["cpu"]["features"]
    assert report["kernels"]["path"] == "avx2" and report["kernels"]["built_for"] == "avx2"
    assert report["threads"]["count"] == 2 and report["threads"]["source"] == "the physical cores"
    assert report["threads"]["fixed_by"] is None
    assert report["threads"]["openmp_wait"] == openmp_wait.state()
    assert report["models"] == [] and report["bench"] is None and report["problems"] == []


def test_no_model_pulled_skips_the_bench_with_a_clear_line(machine, capsys):
    rc, out = doctor_out(capsys)
    assert rc == 0 and "not measured: no model is pulled (speczoo pull qwen2.5-coder-0.5b)" in out


def test_bench_times_the_model_through_the_runtime(machine, capsys, monkeypatch):
    loads = []

    def load_runtime(name, backend=None, max_seq=4096):
        loads.append((name, backend))
        rt = FakeRuntime(name=name)
        rt.chat_ids = lambda messages: rt.tokenizer.encode(messages[0]["content"])
        rt.target = SimpleNamespace(backend=backend or "q4")
        return rt

    monkeypatch.setattr("speczoo.runtime.load_runtime", load_runtime)
    rc, out = doctor_out(capsys, "--model", "tiny", "-n", "8")
    assert rc == 0, out
    assert loads == [("tiny", None)]
    assert "timing tiny: 8 tokens, greedy" in out and "tiny, backend q4:" in out and "tok/s (8 tokens" in out
    rc, out = doctor_out(capsys, "--model", "tiny", "-n", "4", "--backend", "q8", "--json")
    bench = json.loads(out)["bench"]
    assert bench["backend"] == "q8" and bench["tokens"] == 4 and bench["tok_s"] > 0


def test_a_model_that_fails_to_load_is_a_problem(machine, capsys):
    rc, out = doctor_out(capsys, "--model", "qwen2.5-coder-0.5b")
    assert rc == 1
    assert "qwen2.5-coder-0.5b: FAILED: model 'qwen2.5-coder-0.5b' is not pulled yet" in out
    assert "! timing qwen2.5-coder-0.5b failed" in out


def test_the_smallest_sound_model_is_timed():
    models = [{"name": "big", "ok": True, "source_bytes": 3},
              {"name": "broken", "ok": False, "source_bytes": 1},
              {"name": "small", "ok": True, "source_bytes": 2},
              {"name": "unreadable", "ok": False, "problem": "unreadable manifest"}]
    assert doctor.smallest(models) == "small"
    assert doctor.smallest(models[1:2]) is None


@pytest.mark.real
def test_doctor_on_the_real_models(capsys):
    """The real CPU, kernels and the smallest pulled model: a decode speed, no problem on this machine."""
    threads = torch.get_num_threads()
    try:
        rc, out = doctor_out(capsys, "-n", "8", "--json")
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out)
    assert report["kernels"]["built_for"] == report["kernels"]["path"]
    assert report["models"] and report["bench"] is not None and "error" not in report["bench"], report
    assert report["bench"]["tokens"] >= 1 and report["bench"]["tok_s"] > 0, report
    assert rc == (1 if report["problems"] else 0)
