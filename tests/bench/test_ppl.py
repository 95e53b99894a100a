"""`speczoo check MODEL --ppl FILE`: llama-perplexity's protocol (chunks, BOS, the second half scored), the
scores against a reference, the llama.cpp side (faked here by scripts that print what its tools print;
real: the real tools, where they are built), and the report."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import pytest
import torch

from speczoo.bench.ppl import evaluate, make_chunks
from speczoo.bench.ppl_check import format_ppl_report, run_ppl_check, text_of
from speczoo.bench.ppl_llama import find_llama_bin, llama_perplexity
from speczoo.errors import SpeczooError
from speczoo.zoo.gguf_tokenizer import read_tokenizer
from tiny_gguf import write_tiny_gguf

TEXT = "hello world the in def hello the world\n" * 12 + "\n"


def test_chunks_follow_llama_perplexity():
    ids = list(range(100, 123))                                  # 23 ids: two chunks of 10, 3 left over
    c = make_chunks(ids, 10, None, bos_id=7)
    assert c.ids.shape == (2, 10) and c.first == 5 and c.scored_per_chunk == 4 and c.positions == 8
    assert c.ids[:, 0].tolist() == [7, 7] and c.ids[1, 1:].tolist() == ids[11:20]     # BOS replaces the first id
    assert c.targets[1, 0] == 110                                # ... the text keeps it
    assert [t.tolist() for t in c.scored_targets()] == [ids[6:10], ids[16:20]]
    assert torch.equal(make_chunks(ids, 10, 1, None).ids, torch.tensor([ids[:10]]))   # no BOS: ids as they are
    with pytest.raises(ValueError, match="at least 24"):
        make_chunks(ids, 12, None, None)
    with pytest.raises(ValueError, match="holds 2 chunks"):
        make_chunks(ids, 10, 3, None)


def test_scores_of_known_distributions(tmp_path):
    c = make_chunks(list(range(40)), 8, None, None)              # 5 chunks, 3 positions each
    v = 64
    uniform = lambda ids: torch.zeros(3, v)                      # noqa: E731
    score, ref = evaluate(uniform, c, keep=tmp_path / "ref.npy")
    assert score.positions == 15 and math.isclose(score.ppl, v, rel_tol=1e-9)
    same, _ = evaluate(uniform, c, ref)
    assert same.agreement == 1.0 and abs(same.kl) < 1e-7                   # float32 log-probs kept

    def sure(ids: torch.Tensor) -> torch.Tensor:                 # certain of every next id
        out = torch.full((3, v), -30.0)
        out[torch.arange(3), ids[5:8]] = 30.0
        return out
    s, _ = evaluate(sure, c, ref)
    assert s.ppl < 1.0001 and s.kl > 3.0                         # right, and far from the uniform reference
    assert s.agreement == 0.0                                    # the uniform reference's argmax is id 0


def _fake_llama(tmp: Path, ids: list[int], ppl: float = 5.0, same_top: float = 50.0) -> Path:
    """A folder of scripts that answer as llama.cpp's tools do (their output lines, not their arithmetic)."""
    d = tmp / "llama-bin"
    d.mkdir()
    scripts = {
        "llama-tokenize": f"echo '[{', '.join(map(str, ids))}]'",
        "llama-quantize": 'touch "$3"',
        "llama-perplexity": f"""case "$*" in
  *--kl-divergence\\ *|*--kl-divergence) echo "Mean PPL(Q)                   :   {ppl:.6f} ±   0.1"
     echo "Mean    KLD:   0.012345 ±   0.0001"; echo "Same top p: {same_top:.3f} ± 0.500 %" ;;
  *) echo "Final estimate: PPL = {ppl * 0.99:.4f} +/- 0.1" >&2 ;;
esac""",
    }
    for name, body in scripts.items():
        f = d / name
        f.write_text("#!/bin/sh\n" + body + "\n")
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return d


@pytest.fixture
def tiny(tmp_path):
    gguf, _ = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2")
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    ids = read_tokenizer(gguf).encode(text_of(text), add_special=True)
    return gguf, text, ids


def test_report_beside_llama_cpp(tiny, tmp_path):
    gguf, text, ids = tiny
    bin_dir = _fake_llama(tmp_path, ids + [0, 0], ppl=1e6)     # llama-tokenize sees one more newline: allowed
    r = run_ppl_check(str(gguf), text, backend="q8", n_ctx=16, llama_bin=str(bin_dir), log=lambda s: None)
    assert r.chunks == len(ids) // 16 and r.positions == r.chunks * 7
    assert r.llama is not None and r.llama.ppl == 1e6 and r.llama.agreement == 0.5 and r.llama.kl == 0.012345
    assert r.passed, r.failures                                  # far better than this fake llama.cpp
    assert 0.0 <= r.fast.kl and r.fast.agreement > 0.5 and r.fp32.ppl > 1.0
    out = format_ppl_report(r)
    assert "llama.cpp, the GGUF" in out and "PASS" in out and "speczoo q8" in out

    (tmp_path / "b").mkdir()
    worse = _fake_llama(tmp_path / "b", ids, ppl=r.fast.ppl / 1.02)
    r2 = run_ppl_check(str(gguf), text, backend="q8", n_ctx=16, llama_bin=str(worse), log=lambda s: None)
    assert not r2.passed and "more than 1% above" in r2.failures[0] and "FAIL" in format_ppl_report(r2)


def test_different_ids_are_an_error(tiny, tmp_path):
    gguf, text, ids = tiny
    bad = ids[:20] + [ids[20] + 1] + ids[21:]
    with pytest.raises(SpeczooError, match="part at position 20"):
        run_ppl_check(str(gguf), text, backend="q8", n_ctx=16, llama_bin=str(_fake_llama(tmp_path, bad)),
                      log=lambda s: None)


def test_without_llama_cpp_speczoo_side_only(tiny, monkeypatch, tmp_path):
    gguf, text, _ = tiny
    monkeypatch.delenv("SPECZOO_LLAMA_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))                    # no llama-perplexity on PATH
    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path / "home"))   # nor in build_llama.sh's folder
    assert find_llama_bin() is None
    r = run_ppl_check(str(gguf), text, backend="q8", n_ctx=16, log=lambda s: None)
    assert r.llama is None and r.passed and "not found" in format_ppl_report(r)
    with pytest.raises(SpeczooError, match="lacks"):
        find_llama_bin(str(tmp_path))


def _llama_bin() -> Path | None:
    d = find_llama_bin(os.environ.get("SPECZOO_LLAMA_BIN") or None)
    if d is None:
        pytest.skip("llama.cpp's tools are not built (bash benchmarks/build_llama.sh; SPECZOO_LLAMA_BIN)")
    return d


@pytest.mark.real
def test_real_protocol_matches_llama_perplexity(tmp_path):
    """The fp32 reference, by speczoo and by llama.cpp (the GGUF dequantized to F32), on the same ids:
    the same perplexity up to the two programs' float order."""
    from real_models import QWEN_NAME

    bin_dir = _llama_bin()
    text = tmp_path / "text.txt"
    text.write_text((Path(__file__).parents[1] / "conftest.py").read_text() * 8)
    r = run_ppl_check(QWEN_NAME, text, n_ctx=256, n_chunks=2, llama_bin=str(bin_dir), log=lambda s: None)
    assert r.llama is not None
    assert abs(r.fp32.ppl / r.llama.ppl_ref - 1) < 0.002, format_ppl_report(r)
    assert r.fast.agreement > 0.85 and r.llama.agreement > 0.85
