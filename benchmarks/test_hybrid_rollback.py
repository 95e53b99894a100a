"""benchmarks.hybrid_rollback on a tiny shape: every figure is measured, and the report names the CPU and
sets the hybrid's state work beside its verify and the snapshot alternative."""

import argparse

from benchmarks import hybrid_rollback


def test_the_bench_measures_each_k_and_reports_it(capsys):
    rows = hybrid_rollback.measure(dim=128, layers=3, ffn=256, ks=[2, 4], backend="q8", reps=2, prompt=16, vocab=256)
    assert [r.k for r in rows] == [2, 4]
    for r in rows:
        assert min(r.verify, r.plain_verify, r.rollback, r.plain_rollback, r.state, r.snapshot, r.recompute) > 0
    args = argparse.Namespace(dim=128, layers=3, ffn=256, backend="q8", reps=2, max_seq=64)
    text = hybrid_rollback.report(rows, args, 1024, 4096)
    assert "kernels" in text and "snapshot" in text and text.count("\n") == 4
    assert hybrid_rollback.main(["--dim", "128", "--layers", "3", "--ffn", "256", "--ks", "2", "--reps", "1",
                                 "--max-seq", "64"]) == 0
    assert "per sequence: the convolution rows" in capsys.readouterr().out
