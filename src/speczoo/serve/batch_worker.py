"""The worker thread of `speczoo serve --parallel N`: many generations at once in one batch
(Runtime.batch), one target forward per step, instead of one generation after another.

Jobs arrive as for the single `Worker` (same `submit`, `events`, `Job`): the thread admits them first
come first served into the batch (which queues them for a free slot), steps the batch while any
sequence runs, and posts each step's events to their jobs. A job whose client left (disconnect, stop
button) is cancelled before the next step, so its slot is free within one step. More waiting jobs than
--max-queue is QueueFullError (the app answers 503 with Retry-After). `default_parallel` sizes N from
the KV bytes of a slot against the memory available. Never parses HTTP and never reads a model.
"""

from __future__ import annotations

import logging
import queue

from speczoo.context import available_memory
from speczoo.events import DoneEvent
from speczoo.serve.worker import _END, Job, JobFailed, Worker

log = logging.getLogger("speczoo.serve")

MEMORY_SHARE = 0.5     # of the memory available at start that the batch's KV slots may take
MAX_PARALLEL = 8       # the default's ceiling: a CPU's forward stops getting cheaper per row beyond a few rows


def worker_for(runtime, parallel: int, max_queue: int = 64) -> BatchWorker | None:
    """The worker for `--parallel N`: a BatchWorker of N slots, or None for N = 1 (the app then makes its
    one-at-a-time Worker)."""
    return BatchWorker(runtime, parallel, max_queue=max_queue) if parallel > 1 else None


def default_parallel(slot_bytes: int, available: int | None = None) -> tuple[int, str]:
    """How many sequences to batch by default, and a line that states the bound: the KV slots take at
    most MEMORY_SHARE of the available memory, and at most MAX_PARALLEL."""
    avail = available_memory() if available is None else available
    n = max(1, min(MAX_PARALLEL, int(MEMORY_SHARE * avail // slot_bytes)))
    return n, (f"{n} sequences at once, KV {slot_bytes / 2**20:.0f} MiB per slot, {n * slot_bytes / 2**20:.0f} MiB "
               f"in all ({MEMORY_SHARE:.0%} of the {avail / 2**30:.1f} GiB available bounds it at "
               f"{int(MEMORY_SHARE * avail // slot_bytes)}, the default at {MAX_PARALLEL}; set --parallel)")


class BatchWorker(Worker):
    """Runs `runtime.batch(n_slots, chunk)` on its own thread; the Worker's contract for the app."""

    def __init__(self, runtime, n_slots: int, max_queue: int = 64, chunk: int | None = None):
        super().__init__(runtime, max_queue)
        if n_slots < 1:
            raise ValueError(f"--parallel must be >= 1, got {n_slots}")
        self.batch = runtime.batch(n_slots) if chunk is None else runtime.batch(n_slots, chunk)
        self.n_slots = n_slots
        self._live: dict[object, Job] = {}      # the batch's sequences -> their jobs

    @property
    def queued(self) -> int:
        return self._jobs.qsize() + self.batch.waiting

    @property
    def spec_modes(self) -> list[str]:
        return self.batch.spec_modes

    @property
    def running(self) -> int:
        return self.batch.running

    @property
    def batch_size(self) -> int:
        return self.batch.size if self.batch.busy else 0

    def stop(self, timeout: float = 10.0) -> None:
        for job in list(self._live.values()):
            job.cancel()
        super().stop(timeout)

    # -- the worker thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._admit(block=not self.batch.busy):
                self._drop_cancelled()
                if self.batch.busy:
                    self._step()
                self.busy = self.batch.busy
        finally:
            for job in self._live.values():
                job.post(_END)
            self._live.clear()
            self.busy = False

    def _admit(self, block: bool) -> bool:
        """Hand the batch every job that arrived (waiting for one when nothing runs); False on stop."""
        while True:
            try:
                job = self._jobs.get(block=block)
            except queue.Empty:
                return True
            block = False
            if job is None:
                return False
            if job.cancelled.is_set():
                self.cancelled += 1
                job.post(_END)
                continue
            try:
                self._live[self.batch.submit(job.request)] = job
            except Exception as exc:  # noqa: BLE001 - handed to the client, which maps it to an error reply
                job.post(JobFailed(exc))
                job.post(_END)

    def _drop_cancelled(self) -> None:
        for seq, job in list(self._live.items()):
            if job.cancelled.is_set():
                self.batch.cancel(seq)              # its slot is free at the next step
                del self._live[seq]
                self.cancelled += 1
                job.post(_END)

    def _step(self) -> None:
        try:
            moved = self.batch.step()
        except Exception as exc:  # noqa: BLE001 - every job of the batch hears of it; the worker survives
            log.exception("a batched step failed")
            for seq, job in list(self._live.items()):
                self.batch.cancel(seq)
                job.post(JobFailed(exc))
                job.post(_END)
            self._live.clear()
            return
        for seq, events in moved:
            job = self._live.get(seq)
            if job is None:
                continue
            for event in events:
                job.post(event)
            if events and isinstance(events[-1], DoneEvent):
                self.served += 1
                del self._live[seq]
                job.post(_END)
