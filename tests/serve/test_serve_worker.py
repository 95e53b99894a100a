"""The worker alone: FIFO order, one generation at a time, cancellation while queued or running,
errors reported to the job (the worker survives), stop() cancelling the running job, and the Idle
markers of a quiet stream (queued or prefilling)."""

from __future__ import annotations

import asyncio

import pytest

from fake_runtime import FakeRuntime
from speczoo.errors import CacheFullError
from speczoo.events import DoneEvent, TokenEvent
from speczoo.request import GenerationRequest
from speczoo.serve.worker import Idle, QueueFullError, Worker


def req(rt, text, n=10, spec="off"):
    return GenerationRequest(prompt_ids=rt.tokenizer.encode(text), max_new_tokens=n, spec=spec)


async def drain(worker, job):
    return [e async for e in worker.events(job)]


def test_fifo_one_at_a_time_and_cancellation():
    rt = FakeRuntime(delay=0.002)
    worker = Worker(rt)
    worker.start()

    async def main():
        jobs = [worker.submit(req(rt, f"p{i}")) for i in range(4)]
        jobs[2].cancel()                    # cancelled while queued: never runs
        results = await asyncio.gather(*(drain(worker, j) for j in jobs))
        return jobs, results

    try:
        jobs, results = asyncio.run(main())
    finally:
        worker.stop()
    assert [e.request.prompt_ids for e in rt.log] == [rt.tokenizer.encode(f"p{i}") for i in (0, 1, 3)]
    assert results[2] == []
    for i in (0, 1, 3):
        assert isinstance(results[i][-1], DoneEvent)
        assert all(isinstance(e, TokenEvent) for e in results[i][:-1])
    assert worker.served == 3 and worker.cancelled == 1


def test_leaving_the_event_stream_closes_the_generator():
    rt = FakeRuntime(delay=0.01)
    worker = Worker(rt)
    worker.start()

    async def main():
        job = worker.submit(req(rt, "long", n=300))
        async for _ in worker.events(job):
            break                           # the consumer goes away after one event
        follow = worker.submit(req(rt, "next"))
        return await drain(worker, follow)

    try:
        events = asyncio.run(main())
    finally:
        worker.stop()
    assert rt.log[0].closed_early and not rt.log[0].finished
    assert isinstance(events[-1], DoneEvent) and rt.log[1].finished


def test_runtime_errors_reach_the_job_and_the_worker_survives():
    rt = FakeRuntime(max_seq=50)
    worker = Worker(rt)
    worker.start()

    async def main():
        bad = worker.submit(req(rt, "x", n=100))
        with pytest.raises(CacheFullError):
            await drain(worker, bad)
        return await drain(worker, worker.submit(req(rt, "ok", n=5)))

    try:
        events = asyncio.run(main())
    finally:
        worker.stop()
    assert isinstance(events[-1], DoneEvent)


def test_queue_limit_and_stop_cancels_the_running_job():
    rt = FakeRuntime(delay=0.02)
    worker = Worker(rt, max_queue=1)
    worker.start()

    async def main():
        first = worker.submit(req(rt, "a", n=400))
        await first.items.get()             # running now
        worker.submit(req(rt, "b"))
        with pytest.raises(QueueFullError):
            worker.submit(req(rt, "c"))
        return first

    asyncio.run(main())
    worker.stop(timeout=5)
    assert rt.log[0].closed_early
    assert len(rt.log) == 1                 # the queued one was cancelled, never started


def test_idle_markers_while_queued_and_prefilling_lose_no_event():
    rt = FakeRuntime(prefill_delay=0.2)
    worker = Worker(rt)
    worker.start()

    async def main():
        first, second = worker.submit(req(rt, "one")), worker.submit(req(rt, "two"))
        a, b = await asyncio.gather(*(_collect(worker.events(j, idle_after=0.05)) for j in (first, second)))
        with pytest.raises(ValueError, match="idle_after"):
            await _collect(worker.events(first, idle_after=0))
        rt.prefill_delay = 0.0
        return a, b, await drain(worker, worker.submit(req(rt, "two")))

    try:
        a, b, quiet = asyncio.run(main())
    finally:
        worker.stop()
    for events in (a, b):
        idle = [i for i, e in enumerate(events) if isinstance(e, Idle)]
        first_token = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent))
        assert len(idle) >= 2 and max(idle) < first_token
    assert sum(isinstance(e, Idle) for e in b) > sum(isinstance(e, Idle) for e in a), \
        "the second job also waited in the queue"
    tokens = [e for e in b if isinstance(e, TokenEvent)]
    assert tokens == [e for e in quiet if isinstance(e, TokenEvent)] and b[-1].text == quiet[-1].text


async def _collect(events):
    return [e async for e in events]

