"""The soak of issue 22 (`speczoo.bench.soak`, `speczoo serve-soak`): its request mix gets the answers
each kind expects, its accounting adds up, and it fails when the server answers a 5xx, leaks a slot or
grows in memory. Fast, on the fake runtime; the 10-minute figure on the 1.5B is in docs/results.md."""

from __future__ import annotations

import itertools
import random

import httpx
import pytest
from fake_runtime import FakeBatch, FakeRuntime

from speczoo.bench.soak import Sample, SoakResult, run_soak
from speczoo.bench.soak_requests import BY_NAME, KINDS, Context, Outcome, send
from speczoo.serve.app import create_app
from speczoo.serve.background import BackgroundServer
from speczoo.serve.batch_worker import BatchWorker

MIB = 2 ** 20


def flat_memory() -> tuple[int, int]:
    return 100 * MIB, 40 * MIB


def test_every_kind_of_request_gets_the_answer_its_kind_expects():
    rt = FakeRuntime(max_seq=512, delay=0.001)
    ctx = Context(rt.name, rt.max_seq, ("off", "auto", "ngram"), max_tokens=64)
    with BackgroundServer(create_app(rt, worker=BatchWorker(rt, 2))) as s, \
            httpx.Client(base_url=s.url, timeout=60) as client:
        for kind in KINDS:
            for seed in range(3):
                got = send(client, kind, random.Random(seed), ctx)
                assert got.kind == kind.name and not got.problem, got
                assert got.status in kind.expect - {503} or (got.left and kind.name in ("disconnect", "walk-away")), got


def test_a_short_soak_on_the_fake_passes_and_counts_every_request():
    rt = FakeRuntime(max_seq=512, delay=0.001, answer_words=60)
    res = run_soak(rt, 2.0, clients=4, parallel=2, max_queue=2, sample_every=0.1, memory=flat_memory)
    assert res.ok, "\n".join(res.lines())
    assert sum(sum(c.values()) for c in res.counts().values()) == len(res.outcomes) > 20
    assert all(o.status in BY_NAME[o.kind].expect or o.left for o in res.outcomes)
    assert res.last.running == 0 and res.last.waiting == 0 and 0 < res.max_running <= 2
    assert res.samples[-1].t >= 2.0 and len(res.samples) >= 10
    assert res.served > 0 and res.served + res.cancelled <= len(res.outcomes)
    text = "\n".join(res.lines())
    assert "SOAK 5XX 0 PASS" in text and "SOAK SLOTS running 0 waiting 0" in text
    assert "SOAK RSS after the 0.2 s warm-up 100 MiB" in text and "anonymous 60 -> 60 MiB, file-backed 40 -> 40 MiB" in text


class FailingRuntime(FakeRuntime):
    """A runtime whose batched step fails now and then: the worker answers those jobs with an error."""

    def batch(self, n_slots: int, chunk: int = 0) -> FakeBatch:
        batch, step, count = FakeBatch(self, n_slots), FakeBatch.step, itertools.count()

        def failing_step():
            if next(count) % 50 == 49:
                raise RuntimeError("a forward failed")
            return step(batch)

        batch.step = failing_step
        return batch


def test_a_server_that_answers_500_fails_the_soak():
    res = run_soak(FailingRuntime(max_seq=512, delay=0.001), 1.5, clients=4, parallel=2,
                   sample_every=0.1, memory=flat_memory, mix=(BY_NAME["stream"], BY_NAME["whole"]))
    assert res.five_xx > 0 and res.failures and not res.ok
    assert {o.status for o in res.failures} <= {200, 500}          # a stream reports it in-band
    assert "SOAK 5XX" in "\n".join(res.lines()) and "FAIL" in "\n".join(res.lines())


class LeakyBatch(FakeBatch):
    """Forgets to free the slot of the first sequence cancelled while it runs: it counts as running for ever."""

    def __init__(self, runtime: FakeRuntime, n_slots: int):
        super().__init__(runtime, n_slots)
        self.held: list = []

    def cancel(self, entry) -> None:
        if not self.held and entry in self._running:
            self.held.append(self._running.pop(entry))
        super().cancel(entry)

    @property
    def running(self) -> int:
        return super().running + len(self.held)

    @property
    def busy(self) -> bool:
        return super().busy or bool(self.held)


class LeakyRuntime(FakeRuntime):
    def batch(self, n_slots: int, chunk: int = 0) -> FakeBatch:
        return LeakyBatch(self, n_slots)


def test_a_leaked_slot_fails_the_soak():
    res = run_soak(LeakyRuntime(max_seq=512, delay=0.002, answer_words=200), 1.5, clients=3, parallel=4,
                   sample_every=0.1, idle_timeout=0.5, memory=flat_memory, mix=(BY_NAME["disconnect"],))
    assert not res.idle and res.last.running == 1 and not res.slots_ok and not res.ok
    assert "SOAK SLOTS running 1" in "\n".join(res.lines())


def result(outcomes: list[Outcome], rss: list[int], seconds: float = 100.0, every: float = 5.0) -> SoakResult:
    samples = [Sample(i * every, r, 0, 0) for i, r in enumerate(rss)]
    return SoakResult(model="m", seconds=seconds, clients=8, parallel=8, max_queue=64, outcomes=outcomes,
                      samples=samples, idle=True, wall_seconds=seconds)


def test_memory_is_judged_after_the_warm_up_and_fails_past_five_percent():
    ok = [Outcome("stream", 200)]
    growing = result(ok, [50 * MIB, 90 * MIB] + [100 * MIB + i * MIB for i in range(19)])
    assert growing.warmup_s == 10.0 and growing.rss_warm == 100 * MIB          # 10% of 100 s
    assert growing.drift == pytest.approx(0.18) and not growing.memory_ok and not growing.ok
    flat = result(ok, [50 * MIB, 90 * MIB] + [100 * MIB + (i % 3) * MIB for i in range(19)])
    assert flat.memory_ok and flat.ok and flat.peak == pytest.approx(0.02)
    long = result(ok, [100 * MIB] * 200, seconds=1000.0)
    assert long.warmup_s == 60.0 and long.rss_warm == 100 * MIB


def test_only_the_full_queues_503_and_the_expected_4xx_pass():
    rss = [100 * MIB] * 30
    fine = [Outcome("stream", 200), Outcome("whole", 503), Outcome("disconnect", 200, left=True),
            Outcome("walk-away", None, left=True), Outcome("bad-json", 400), Outcome("unknown-model", 404)]
    assert result(fine, rss).ok and result(fine, rss).queue_full == 1
    for wrong in (Outcome("whole", 500), Outcome("stream", 200, "stream error: boom"),
                  Outcome("whole", 503, "503 not from a full queue: code None, Retry-After None")):
        res = result(fine + [wrong], rss)
        assert res.five_xx == 1 and not res.ok, wrong
    for wrong in (Outcome("bad-temperature", 200), Outcome("unknown-model", 400), Outcome("stream", None),
                  Outcome("stream", 200, "stream cut: it ended without data: [DONE]")):
        res = result(fine + [wrong], rss)
        assert res.five_xx == 0 and res.failures == [wrong] and not res.ok, wrong


def test_the_command_prints_the_report(monkeypatch, capsys):
    import speczoo.bench.soak
    import speczoo.runtime
    from speczoo.cli import main

    rt = FakeRuntime(max_seq=512, delay=0.001)
    monkeypatch.setattr(speczoo.runtime, "load_runtime", lambda *a, **kw: rt)
    monkeypatch.setattr(speczoo.bench.soak, "process_memory", flat_memory)
    code = main(["serve-soak", "fake-model", "--seconds", "1", "--clients", "2", "--parallel", "2",
                 "--sample-every", "0.2", "--max-tokens", "16"])
    out = capsys.readouterr().out
    assert "soak: 2 clients for 1 s" in out and "SOAK 5XX 0 PASS" in out and "SOAK SLOTS" in out
    assert "SOAK RSS" in out and "FAIL" not in out and code == 0
