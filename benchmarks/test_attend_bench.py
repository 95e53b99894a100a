"""The attention bench (python -m benchmarks.attend_bench): a verify's chain of S rows runs through the same
timing as a decode row, on a small shape. Speeds themselves are measured by the bench, never asserted here."""

from benchmarks import attend_bench as ab


def test_a_chain_of_rows_is_timed_and_printed_per_row(monkeypatch, capsys):
    monkeypatch.setattr(ab, "STREAM_BYTES", 1 << 16)     # a few small caches, not 128 MiB of them
    monkeypatch.setattr(ab, "PASS_SECONDS", 0.01)
    assert ab.time_attend(n=40, g=2, hkv=1, dh=16, threads=1, reps=1, s=3) > 0
    ab.main(["--n", "40", "--s", "1,3", "--threads", "1", "--G", "2", "--hkv", "1", "--dh", "16", "--reps", "1"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("n=")]
    assert [ln.split("S=")[1].split()[0] for ln in lines] == ["1", "3"]
    assert all("ms/row" in ln for ln in lines)
