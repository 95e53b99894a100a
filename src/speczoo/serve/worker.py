"""The single worker thread that owns the runtime, and the FIFO queue of generation jobs in front of it.

The runtime is not thread-safe and holds one KV cache, so exactly one generation runs at a time, on
this thread, in arrival order (fair). Each job streams its events back to the asyncio loop that
submitted it. A job cancelled by its client (disconnect, stop button) is skipped if still queued, or
its generator is closed after the current round, which ends the generation and frees the cache for
the next job. This module never parses HTTP and never reads a model's internals.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import AsyncIterator

from speczoo.events import DoneEvent, TokenEvent
from speczoo.request import GenerationRequest

log = logging.getLogger("speczoo.serve")


class QueueFullError(RuntimeError):
    """More jobs are waiting than --max-queue allows."""


@dataclass
class JobFailed:
    """The runtime raised while starting or running this job."""

    error: BaseException


@dataclass(frozen=True)
class Idle:
    """Yielded by `Worker.events(job, idle_after=s)` after each `s` seconds without an event (the job
    is queued, or its prompt is being prefilled): a chance for the consumer to keep its client busy."""

    seconds: float


_END = object()  # sentinel: the job produced its last item


@dataclass
class Job:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    number: int
    items: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    created: float = field(default_factory=time.monotonic)
    first_token: float | None = None        # when its first token reached the consumer

    def cancel(self) -> None:
        self.cancelled.set()

    def post(self, item: object) -> None:
        """Hand one item to the submitting loop (called on the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:    # the loop is closed: the server is shutting down; nobody listens
            self.cancel()


class Worker:
    """Runs `runtime.generate` for queued jobs, one at a time, on its own thread."""

    def __init__(self, runtime, max_queue: int = 64):
        self.runtime = runtime
        self.max_queue = max_queue
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._numbers = itertools.count()
        self.busy = False
        self._current: Job | None = None
        self.served = 0         # jobs whose generation reached its DoneEvent
        self.on_event: Callable[[Job, object], None] | None = None   # sees each event as it is consumed (/metrics)
        self.cancelled = 0      # jobs cancelled while queued or running

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the worker is already started")
        self._thread = threading.Thread(target=self._loop, name="speczoo-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is queued and what runs (after its current round), and join the thread."""
        if self._thread is None:
            return
        current = self._current
        if current is not None:
            current.cancel()
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                job.post(_END)
        self._jobs.put(None)
        self._thread.join(timeout)
        self._thread = None

    @property
    def spec_modes(self) -> list[str]:
        """The speculative modes a request may name here."""
        return self.runtime.spec_modes

    @property
    def running(self) -> int:
        return 1 if self.busy else 0

    @property
    def batch_size(self) -> int:
        """Sequences in each target forward now."""
        return self.running

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    # -- called from the event loop ------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> Job:
        if self._thread is None:
            raise RuntimeError("the worker is not running: call start() first")
        if self.queued >= self.max_queue:
            raise QueueFullError(f"{self.queued} requests are already waiting (--max-queue "
                                 f"{self.max_queue}); retry later")
        job = Job(request, asyncio.get_running_loop(), next(self._numbers))
        self._jobs.put(job)
        return job

    async def events(self, job: Job, idle_after: float | None = None
                     ) -> AsyncIterator[TokenEvent | DoneEvent | Idle]:
        """Yield the job's events; raise what the runtime raised. Leaving early cancels the job.
        With `idle_after` (seconds), also yield an `Idle` after each such quiet interval."""
        if idle_after is not None and idle_after <= 0:
            raise ValueError(f"idle_after must be > 0 seconds (or None), got {idle_after}")
        try:
            while True:
                if idle_after is None or not job.items.empty():
                    item = await job.items.get()
                else:
                    try:   # Queue.get is cancellation-safe: a timeout loses no item
                        item = await asyncio.wait_for(job.items.get(), idle_after)
                    except asyncio.TimeoutError:
                        yield Idle(idle_after)
                        continue
                if item is _END:
                    return
                if isinstance(item, JobFailed):
                    raise item.error
                if self.on_event is not None:
                    self.on_event(job, item)
                yield item
        finally:
            job.cancel()   # no-op when it already ended; otherwise frees the runtime after this round

    # -- the worker thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                self.cancelled += 1
                job.post(_END)
                continue
            self.busy, self._current = True, job
            try:
                self._run(job)
            finally:
                self.busy, self._current = False, None
                job.post(_END)

    def _run(self, job: Job) -> None:
        try:
            gen = self.runtime.generate(job.request)
        except Exception as exc:  # noqa: BLE001 - handed to the client, which maps it to an error reply
            job.post(JobFailed(exc))
            return
        try:
            for event in gen:
                job.post(event)
                if isinstance(event, DoneEvent):
                    self.served += 1
                    return
                if job.cancelled.is_set():
                    self.cancelled += 1
                    return
            job.post(JobFailed(RuntimeError("the runtime ended a generation without a DoneEvent")))
        except Exception as exc:  # noqa: BLE001 - reported to the client; the worker must survive
            log.exception("generation %d failed", job.number)
            job.post(JobFailed(exc))
        finally:
            gen.close()   # ends a cancelled generation and frees the KV cache for the next job
