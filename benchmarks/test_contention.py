"""benchmarks/contention.py: the busy loop spins on the core it is given and is gone after its block;
llama-bench's JSON is read; the table gives medians and the busy / quiet ratio."""

import json
import os

import pytest

from benchmarks import contention


def test_the_busy_loop_spins_on_its_core_and_is_reaped():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with contention.busy_core(cpu) as hog:
        assert hog.poll() is None and os.sched_getaffinity(hog.pid) == {cpu}
    assert hog.returncode is not None


def test_quiet_and_busy_stretches_alternate_and_run_every_measure(monkeypatch):
    seen = []
    monkeypatch.setattr(contention, "busy_core", lambda cpu: _Marker(seen))
    measures = {name: (lambda name=name: seen.append(name) or float(len(seen))) for name in ("a", "b")}
    out = contention.alternate(measures, 2, 0)
    assert seen == ["a", "b", "busy", "a", "b", "idle", "a", "b", "busy", "a", "b", "idle"]
    assert out == {"a": ([1.0, 7.0], [4.0, 10.0]), "b": ([2.0, 8.0], [5.0, 11.0])}
    seen.clear()
    contention.alternate(measures, 1, 0, settle=lambda: seen.append("settle"))
    assert seen == ["settle", "a", "b", "busy", "settle", "a", "b", "idle"]


def test_the_counting_steer_passes_everything_through_and_counts_threads():
    import torch

    class Steer:
        def __init__(self):
            self.calls = []

        def begin(self):
            self.calls.append("begin")

        def timed(self, s, seconds):
            self.calls.append(("timed", s, seconds))
            return False

        def end(self):
            self.calls.append("end")

    inner = Steer()
    counting = contention.CountingSteer(inner)
    counting.begin()
    assert counting.timed(3, 0.5) is False
    counting.end()
    assert inner.calls == ["begin", ("timed", 3, 0.5), "end"]
    assert counting.counts == [torch.get_num_threads()] and counting.mean_since(0) == torch.get_num_threads()


class _Marker:
    def __init__(self, seen):
        self.seen = seen

    def __enter__(self):
        self.seen.append("busy")

    def __exit__(self, *exc):
        self.seen.append("idle")


def test_reads_llama_benchs_decode_row():
    rows = [{"n_prompt": 0, "n_gen": 32, "avg_ts": 9.39, "stddev_ts": 0.1}]
    assert contention.llama_bench_tok_s(json.dumps(rows)) == 9.39
    with pytest.raises(RuntimeError, match="no decode row"):
        contention.llama_bench_tok_s(json.dumps([{"n_prompt": 512, "n_gen": 0, "avg_ts": 100.0}]))


def test_the_table_gives_medians_and_the_ratio():
    text = contention.table([("speczoo", [10.0, 14.0, 12.0], [6.0, 7.0, 9.0])])
    assert "| speczoo | 12.00 | 7.00 | 0.58x | 10.00 14.00 12.00; 6.00 7.00 9.00 |" in text
