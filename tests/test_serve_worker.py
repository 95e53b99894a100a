"""The worker alone: FIFO order, one generation at a time, cancellation while queued or running,
errors reported to the job (the worker survives), and stop() cancelling the running job."""

from __future__ import annotations

import asyncio

import pytest

from fake_runtime import FakeRuntime
from speczoo.errors import CacheFullError
from speczoo.events import DoneEvent, GenerationRequest, TokenEvent
from speczoo.serve.worker import QueueFullError, Worker


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
