"""benchmarks.shape_models: the figures it reads from llama-bench and `speczoo bench`, Llama 3.1's rope_freqs,
and a tiny Llama-3.2-style shape (tied embeddings, rope_freqs, Llama 3's tokenizer) written by the same
writer, quantized by llama.cpp's llama-quantize and measured by llama-bench (skipped without llama.cpp), then
pulled and run by speczoo."""

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import shape_models
from benchmarks.pull_scale import llama3_rope_factors, tensor_plan

LLAMA_BIN = Path("/work/peers/llama.cpp/build/bin")
TINY = dict(shape_models.LLAMA_32, layers=2, dim=256, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=1280)


def _test(n_prompt: int, n_gen: int, samples: list[int]) -> dict:
    return {"n_prompt": n_prompt, "n_gen": n_gen, "samples_ns": samples}


def test_llama_bench_figures_are_median_times_over_one_decode_step():
    tests = [_test(2, 0, [30, 20, 90]), _test(5, 0, [25, 25, 25]), _test(0, 8, [80, 80, 800])]
    got = shape_models.llama_bench_figures(tests, 8)                       # a step: median 80 / 8 = 10 ns
    assert got["cv"] == {1: 1.0, 2: 3.0, 5: 2.5}
    assert got["tok_s"] == pytest.approx(1e8) and got["ms1"] == pytest.approx(1e-5)


def test_spec_stats_are_read_from_the_bench_line():
    out = "prompt: 9 tokens\nSPEC LOSSLESS 8/8 PASS\nSPEC STATS greedy=4.50 tok/s spec=5.00 tok/s speedup=1.11x " \
          "accepted/round=0.25 forwards=7\n"
    assert shape_models._spec_stats(out) == {"greedy": 4.5, "spec": 5.0, "speedup": 1.11, "accepted": 0.25,
                                             "forwards": 7}


def test_a_child_s_anonymous_and_file_backed_memory_are_told_apart(tmp_path):
    f = tmp_path / "data"
    f.write_bytes(bytes(64 << 20))
    code = (f"import mmap, time; fh = open({str(f)!r}, 'rb'); m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ); "
            "s = sum(m[i] for i in range(0, len(m), 4096)); a = bytearray(96 << 20); time.sleep(0.5)")
    run = shape_models.run_measured([sys.executable, "-c", code])
    assert run.anon > 96 << 20 and run.file > 64 << 20 and run.peak >= (96 + 64) << 20


def test_the_memory_table_puts_both_systems_side_by_side():
    row = dict(label="m", kind="Q4_K_M", gb=1.0, bundle_gb=1.1,
               memory={"peak": 2e9, "anon": 0.5e9, "file": 1.5e9}, llama_memory={"peak": 1e9, "anon": 0.2e9, "file": 0.8e9})
    line = shape_models.memory_table([row], 4096).splitlines()[-1]
    assert line == "| m | Q4_K_M | 1.00 | 1.10 | 2.00 / 1.00 (2.00×) | 0.50 / 0.20 | 1.50 / 0.80 |"


def test_llama3_rope_factors_keep_short_wavelengths_and_divide_long_ones():
    f = llama3_rope_factors(dict(head_dim=128, rope_factor=8.0))
    assert f.shape == (64,) and f.dtype == np.float32
    assert f[0] == 1.0 and f[-1] == 8.0 and np.all(np.diff(f) >= 0)


def test_a_llama_32_plan_has_no_biases_no_output_and_rope_freqs():
    names = {name for name, _, _ in tensor_plan("F16", TINY)}
    assert "output.weight" not in names and "rope_freqs.weight" in names
    assert not any(name.endswith(".bias") for name in names)


def test_the_8b_shape_is_llama_31s():
    _, s = shape_models.SIZES["8b"]
    names = {name for name, _, _ in tensor_plan("F16", s)}
    assert s["arch"] == "llama" and "output.weight" in names and s["layers"] * s["dim"] == 32 * 4096


@pytest.mark.slow                                                         # ~20 s quiet: quantize, bench, pull
@pytest.mark.skipif(not (LLAMA_BIN / "llama-quantize").exists(), reason="llama.cpp is not built here")
def test_a_tiny_llama_shape_runs_in_llama_cpp_and_speczoo(tmp_path, monkeypatch):
    monkeypatch.setitem(shape_models.SIZES, "tiny", ("tiny", TINY))
    args = argparse.Namespace(dir=tmp_path, threads=2, gen=4, repeats=1, fresh=False, cached_only=False,
                              llama_bin=LLAMA_BIN)
    bench = shape_models.Bench(args)
    path = bench.shape_file("tiny", "Q4_K_M")
    assert path.exists() and (tmp_path / "tiny-F16.gguf").exists()
    figures = bench.llama(path)
    assert set(figures["cv"]) == {1, *shape_models.CV_SIZES} and figures["tok_s"] > 0 and figures["peak"] > 0
    assert bench.shape_file("tiny", "Q4_K_M") == path                      # cached: not written again

    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path / "home"))
    from speczoo.runtime import load
    from speczoo.zoo.pull import pull
    pull(str(path), progress=False, log=lambda _: None)
    m = load(str(path))
    assert m.args.arch == "llama" and m.tokenizer.bos_id == TINY["vocab"] - 256
    theta = 500_000.0 ** (torch.arange(0, 64, 2).float() / 64)
    factors = torch.from_numpy(llama3_rope_factors(TINY))
    assert torch.allclose(m.model.ropes[False].inv_freq, 1.0 / theta / factors)
    with torch.inference_mode():
        from speczoo.cache import KVCache
        logits = m.model(torch.tensor([1, 2, 3]), torch.arange(3), KVCache(m.args, 8)).logits
    assert logits.shape == (3, TINY["vocab"]) and torch.isfinite(logits).all()


def test_the_draft_at_scale_sets_the_cost_model_beside_the_forced_run(monkeypatch):
    forced = {"k": 4, "alpha": 0.7, "measured": 1.5, "tokens_per_round": 2.8, "expected_tokens": 2.77,
              "greedy_tok_s": 5.0, "forced_tok_s": 7.5, "lossless": True,
              "priced": {"r": 0.2, "cv_k1": 1.3, "overhead": 0.02, "predicted": 1.6},
              "in_run": {"r": 0.21, "cv_k1": 1.35, "overhead": 0.05, "step_ms": 200.0, "predicted": 1.55}}
    bench = argparse.Namespace(args=argparse.Namespace(alpha=0.7), draft_run=lambda target, draft, k: forced)
    cv = {1: 1.0, 2: 1.1, 5: 1.4, 9: 2.0}
    target = dict(label="8B shape", kind="Q4_K_M", path=Path("t"), cv={"ms1": 200.0, "cv": cv},
                  llama={"ms1": 180.0, "cv": cv})
    draft = dict(label="1B shape", kind="Q4_K_M", path=Path("d"), cv={"ms1": 40.0, "cv": cv},
                 llama={"ms1": 35.0, "cv": cv})
    text = shape_models.draft_at_scale(bench, target, draft, 4, 8)
    assert "| speczoo cv (full-vocabulary draft step) | 0.200 | 1.10/1.40/2.00 | 0.30 |" in text
    assert "| llama.cpp (llama-bench) | 0.194 |" in text
    assert "| the runtime's profile | 0.200 | 1.30 | 0.020 | 1.60× | 1.50× |" in text
    assert "output equal to greedy: yes" in text


def test_a_forced_kernel_path_keeps_its_own_figures():
    assert shape_models.results_name(None) == "results.json"
    assert shape_models.results_name("avx2") == "results-avx2.json"


def test_decode_rounds_alternate_the_systems_and_the_table_quotes_their_medians(tmp_path, monkeypatch):
    args = argparse.Namespace(dir=tmp_path, rounds=3, fresh=False, cached_only=False,
                              llama_bin=tmp_path, threads=2, gen=8, repeats=1)
    bench = shape_models.Bench(args)
    calls = []
    speeds = iter([(12.0, 10.0), (9.0, 10.0)])          # rounds 2 and 3: speczoo, then llama.cpp
    pair = []

    def speczoo_decode(path):
        calls.append("speczoo")
        pair[:] = next(speeds)
        return {"tok_s": pair[0], "peak": 1}

    def llama_decode(path):
        calls.append("llama")
        return pair[1]

    monkeypatch.setattr(bench, "_speczoo_decode", speczoo_decode)
    monkeypatch.setattr(bench, "_llama_decode", llama_decode)
    got = bench.decode_rounds(tmp_path / "m.gguf", (11.0, 10.0))
    assert calls == ["speczoo", "llama", "speczoo", "llama"]
    assert got["speczoo"] == [11.0, 12.0, 9.0] and got["llama"] == [10.0, 10.0, 10.0]
    assert bench.decode_rounds(tmp_path / "m.gguf", (0.0, 1.0))["speczoo"] == [11.0, 12.0, 9.0]   # cached
    cell = shape_models._decode_cell({"greedy": {"tok_s": 11.0}, "llama": {"tok_s": 10.0}, "rounds": got})
    assert cell == "11.00 / 10.00 (**1.10×**, 0.90–1.20 over 3 rounds)"
    assert shape_models._decode_cell({"greedy": {"tok_s": 11.0}, "llama": {"tok_s": 10.0}}) == "11.00 / 10.00 (1.10×)"
