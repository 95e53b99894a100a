"""The server soaked: C clients for D seconds of mixed traffic on one served runtime; no 5xx, no slot
leaked, resident memory flat (`speczoo serve-soak`).

`run_soak(runtime, seconds, clients=8, parallel=8)` serves `runtime` through the real HTTP app on a
free loopback port (`parallel` > 1: its batch worker, as `speczoo serve --parallel`), then runs
`clients` threads, each sending requests of the mix in soak_requests.py one after another until the
time is up (valid streams and whole answers, sampled ones, clients that leave midway, bad requests).
A sampler thread reads the process's resident memory (psutil) and /metrics' running and waiting
requests every `sample_every` seconds. When the clients are done it waits for the worker to go idle
and reads /metrics a last time.

The criteria (`SoakResult.ok`):
- no 5xx, and no error inside a 200 stream: a 503 with code `queue_full` and Retry-After is allowed,
  it is the bounded queue telling a client to retry; every other answer is the one its kind expects
  (bad requests their 4xx);
- no slot leaked: /metrics shows 0 running and 0 waiting once the clients are gone (within
  `idle_timeout`), and running never exceeded `parallel`;
- resident memory flat: every sample from the end of the warm-up to the end stays within 5% of the
  sample at the end of the warm-up.
The report splits resident memory into anonymous pages (the heap, tensors: where a leak shows) and
file-backed ones (code and mapped files, first touched when a code path first runs: these may creep
up slowly and are no leak); the criterion holds for the whole.

The warm-up is the first 60 s or the first 10% of the run, whichever is shorter. Until then the
process still gains memory that stays for its whole life and is not a leak: the code paths and caches
touched by the first request of each kind (tokenizer, validators, the kernels' scratch for each batch
shape), and the allocator's free lists and per-thread arenas growing to what a full batch of
`clients` concurrent streams needs. A few full-batch rounds of every kind reach that (at 8 clients a
minute holds dozens); a longer warm-up would hide a slow leak in a short run, hence the 10% cap.

The server runs in this process, so the memory measured is the server's (plus the clients' small
share, the same at the warm-up and at the end). Nothing here loads a model or binds beyond 127.0.0.1.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from speczoo.bench.soak_requests import (
    BY_NAME,
    KINDS,
    Context,
    Kind,
    Outcome,
    pick,
    send,
)

WARMUP_S = 60.0         # the warm-up is at most this long ...
WARMUP_SHARE = 0.10     # ... and at most this share of the run
FLAT = 0.05             # resident memory stays within this share of its warm-up figure
SOAK_MODES = ("off", "auto", "ngram")   # the spec modes valid requests pick from, where offered


@dataclass
class Sample:
    t: float                # seconds since the clients started
    rss: int                # resident bytes of this process
    running: int | None     # /metrics speczoo_requests_running (None: the scrape failed)
    waiting: int | None
    file: int = 0           # of rss, the pages backed by files (code, mapped weights); the rest is anonymous


@dataclass
class SoakResult:
    model: str
    seconds: float              # the clients' time budget
    clients: int
    parallel: int
    max_queue: int
    outcomes: list[Outcome]
    samples: list[Sample]       # during the run, then one after the worker went idle
    idle: bool                  # /metrics reached 0 running and 0 waiting after the clients
    wall_seconds: float         # the clients' actual time (the last request ends after the budget)
    served: int = 0             # /health: generations that reached their end
    cancelled: int = 0          # /health: generations cancelled (clients that left)
    scrape_errors: list[str] = field(default_factory=list)

    # -- answers ----------------------------------------------------------------------------------
    def counts(self) -> dict[str, Counter]:
        """Per kind: how many requests got each outcome label."""
        out: dict[str, Counter] = {}
        for o in self.outcomes:
            out.setdefault(o.kind, Counter())[o.label] += 1
        return out

    @property
    def failures(self) -> list[Outcome]:
        """Requests answered wrongly: a problem, a status their kind does not expect, or no answer."""
        return [o for o in self.outcomes if o.problem or (o.status is None and not o.left)
                or (o.status is not None and o.status not in BY_NAME[o.kind].expect)]

    @property
    def five_xx(self) -> int:
        """5xx answers other than the full queue's 503, plus errors reported inside a 200 stream."""
        return sum(((o.status or 0) >= 500 and not (o.status == 503 and not o.problem))
                   or o.problem.startswith("stream error") for o in self.outcomes)

    @property
    def queue_full(self) -> int:
        return sum(o.status == 503 and not o.problem for o in self.outcomes)

    # -- slots ------------------------------------------------------------------------------------
    @property
    def last(self) -> Sample:
        return self.samples[-1]

    @property
    def max_running(self) -> int:
        return max((s.running for s in self.samples if s.running is not None), default=0)

    @property
    def slots_ok(self) -> bool:
        return self.idle and self.last.running == 0 and self.last.waiting == 0 and self.max_running <= self.parallel

    # -- memory -----------------------------------------------------------------------------------
    @property
    def warmup_s(self) -> float:
        return min(WARMUP_S, WARMUP_SHARE * self.seconds)

    @property
    def after_warmup(self) -> list[Sample]:
        """The samples from the end of the warm-up on (the first is the reference)."""
        return [s for s in self.samples if s.t >= self.warmup_s]

    @property
    def rss_warm(self) -> int:
        return self.after_warmup[0].rss

    @property
    def rss_max(self) -> int:
        return max(s.rss for s in self.after_warmup)

    @property
    def drift(self) -> float:
        """The end's resident memory against the warm-up's, as a fraction (+0.01 = 1% more)."""
        return self.last.rss / self.rss_warm - 1

    @property
    def peak(self) -> float:
        """The farthest any sample after the warm-up strayed from the warm-up's figure."""
        return max(abs(s.rss / self.rss_warm - 1) for s in self.after_warmup)

    @property
    def memory_ok(self) -> bool:
        return self.peak <= FLAT

    @property
    def ok(self) -> bool:
        return not self.failures and self.five_xx == 0 and self.slots_ok and self.memory_ok

    def lines(self) -> list[str]:
        mib = 2 ** 20
        ok = {True: "PASS", False: "FAIL"}
        out = [(f"soak: {self.clients} clients for {self.seconds:g} s ({self.wall_seconds:.0f} s with the last "
                f"answers) on {self.model}, --parallel {self.parallel}, --max-queue {self.max_queue}: "
                f"{len(self.outcomes)} requests; the server finished {self.served} generations and "
                f"cancelled {self.cancelled} (clients that left)")]
        for kind, c in sorted(self.counts().items()):
            out.append(f"  {kind:16s} " + ", ".join(f"{label} x{n}" for label, n in sorted(c.items())))
        out += [f"  ! {o.kind}: status {o.status} {o.problem}" for o in self.failures[:5]]
        out += [f"  ! /metrics: {e}" for e in self.scrape_errors[:3]]
        out.append(f"SOAK 5XX {self.five_xx} {ok[self.five_xx == 0 and not self.failures]} "
                   f"({len(self.failures)} answers not what their kind expects; {self.queue_full} 503 from "
                   f"a full queue, allowed: they say retry later)")
        out.append(f"SOAK SLOTS running {self.last.running} waiting {self.last.waiting} after the clients "
                   f"(max running seen {self.max_running} of {self.parallel}) {ok[self.slots_ok]}")
        warm = self.after_warmup[0]
        out.append(f"SOAK RSS after the {self.warmup_s:g} s warm-up {self.rss_warm / mib:.0f} MiB, at the end "
                   f"{self.last.rss / mib:.0f} MiB, max {self.rss_max / mib:.0f} MiB (anonymous "
                   f"{(warm.rss - warm.file) / mib:.0f} -> {(self.last.rss - self.last.file) / mib:.0f} MiB, "
                   f"file-backed {warm.file / mib:.0f} -> {self.last.file / mib:.0f} MiB): drift {self.drift:+.1%}, "
                   f"farthest {self.peak:.1%} (flat: within {FLAT:.0%}) {ok[self.memory_ok]}")
        shown = self.samples[::max(1, len(self.samples) // 10)]
        shown += [self.last] if shown[-1] is not self.last else []
        out.append("  RSS MiB over time: " + ", ".join(f"{s.t:.0f}s {s.rss / mib:.0f}" for s in shown))
        return out


def scrape(client: httpx.Client) -> tuple[int, int]:
    """/metrics' running and waiting requests."""
    text = client.get("/metrics").raise_for_status().text
    value = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return int(value["speczoo_requests_running"]), int(value["speczoo_requests_waiting"])


class Sampler:
    """A thread that samples resident memory and /metrics every `every` seconds until stopped."""

    def __init__(self, url: str, every: float, memory: Callable[[], tuple[int, int]], headers: dict):
        self.every, self.memory = every, memory
        self.client = httpx.Client(base_url=url, headers=headers, timeout=30)
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="speczoo-soak-sampler", daemon=True)

    def take(self) -> Sample:
        try:
            running, waiting = scrape(self.client)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            running = waiting = None
            self.errors.append(f"{type(exc).__name__}: {exc}")
        rss, file = self.memory()
        s = Sample(time.monotonic() - self.t0, rss, running, waiting, file)
        self.samples.append(s)
        return s

    def _loop(self) -> None:
        while not self._stop.wait(max(0.0, self.every * (len(self.samples)) - (time.monotonic() - self.t0))):
            self.take()

    def start(self) -> None:
        self.take()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def wait_idle(self, timeout: float) -> bool:
        """Sample until /metrics shows nothing running or waiting (True), or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.take()
            if s.running == 0 and s.waiting == 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)


def process_memory() -> tuple[int, int]:
    """This process's resident bytes, and how many of them are backed by files (Linux: RssFile +
    RssShmem; pages of code and mapped files that the kernel may drop and read back, not a leak)."""
    info = psutil.Process().memory_info()
    return info.rss, getattr(info, "shared", 0)


def run_soak(runtime, seconds: float, clients: int = 8, parallel: int = 8, max_queue: int = 64,
             max_tokens: int = 128, seed: int = 0, sample_every: float = 5.0, idle_timeout: float = 120.0,
             api_key: str | None = None, memory: Callable[[], tuple[int, int]] | None = None,
             mix: tuple[Kind, ...] = KINDS) -> SoakResult:
    """Serve `runtime` on loopback and soak it (see the module doc). `memory` reads the resident bytes
    and their file-backed share (default: this process's); `mix` is the kinds of request the clients draw from."""
    from speczoo.serve.app import create_app
    from speczoo.serve.background import BackgroundServer
    from speczoo.serve.batch_worker import worker_for

    if seconds <= 0 or clients < 1 or parallel < 1 or max_tokens < 1 or sample_every <= 0:
        raise ValueError(f"the soak needs seconds, sample_every > 0 and clients, parallel, max_tokens >= 1; "
                         f"got {seconds}, {sample_every}, {clients}, {parallel}, {max_tokens}")
    app = create_app(runtime, api_key=api_key, max_queue=max_queue, worker=worker_for(runtime, parallel, max_queue))
    modes = tuple(m for m in SOAK_MODES if m in app.state.worker.spec_modes)
    ctx = Context(runtime.name, runtime.max_seq, modes, max_tokens)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with BackgroundServer(app) as server:
        sampler = Sampler(server.url, sample_every, memory or process_memory, headers)
        deadline = sampler.t0 + seconds

        def client(i: int) -> list[Outcome]:
            rng, out = random.Random(f"{seed}:{i}"), []
            with httpx.Client(base_url=server.url, headers=headers, timeout=600) as http:
                while time.monotonic() < deadline:
                    out.append(send(http, pick(rng, mix), rng, ctx))
            return out

        sampler.start()
        try:
            with ThreadPoolExecutor(clients) as pool:
                outcomes = [o for got in pool.map(client, range(clients)) for o in got]
        finally:
            sampler.stop()
        wall = time.monotonic() - sampler.t0
        idle = sampler.wait_idle(idle_timeout)
        health = sampler.client.get("/health").json()
        sampler.client.close()
    return SoakResult(model=runtime.name, seconds=seconds, clients=clients, parallel=parallel,
                      max_queue=max_queue, outcomes=outcomes, samples=sampler.samples, idle=idle,
                      wall_seconds=wall, served=health["served"], cancelled=health["cancelled"],
                      scrape_errors=sampler.errors)
