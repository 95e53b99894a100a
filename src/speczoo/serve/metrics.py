"""`GET /metrics` in the Prometheus text format: running and waiting requests, generated tokens, accepted
draft tokens per round, the batch size and the time to first token.

`Metrics(worker)` keeps its own registry (one per app, so that several apps in one process never share
series) and sees every event the app takes from the worker (`Worker.on_event`); the gauges read the
worker when scraped. Tokens per second is the rate of `speczoo_generated_tokens_total`. Never touches a
model and never blocks the worker thread.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from speczoo.events import TokenEvent
from speczoo.serve.worker import Job

ACCEPTED_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, worker):
        self.registry = r = CollectorRegistry()
        Gauge("speczoo_requests_running", "Requests generating now", registry=r).set_function(
            lambda: worker.running)
        Gauge("speczoo_requests_waiting", "Requests waiting for a slot", registry=r).set_function(
            lambda: worker.queued)
        Gauge("speczoo_batch_size", "Sequences in the last target forward (1 at most without --parallel)",
              registry=r).set_function(lambda: worker.batch_size)
        self.tokens = Counter("speczoo_generated_tokens", "Tokens generated (rate: tokens per second)", registry=r)
        self.accepted = Histogram("speczoo_accepted_per_round", "Draft tokens accepted per speculative round",
                                  buckets=ACCEPTED_BUCKETS, registry=r)
        self.ttft = Histogram("speczoo_time_to_first_token_seconds", "From a request's arrival to its first "
                              "token, waiting and prefill included", buckets=TTFT_BUCKETS, registry=r)
        worker.on_event = self.event

    def event(self, job: Job, item: object) -> None:
        if not isinstance(item, TokenEvent) or not item.ids:
            return
        self.tokens.inc(len(item.ids))
        if item.drafted:
            self.accepted.observe(item.accepted)
        if job.first_token is None:
            job.first_token = time.monotonic()
            self.ttft.observe(job.first_token - job.created)

    def add_route(self, app: FastAPI) -> None:
        @app.get("/metrics", include_in_schema=False)
        async def metrics() -> Response:
            return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
