"""Continuous batching: many requests' rounds in ONE target forward per step, each in its own KV slot.

`BatchEngine` owns a SlotCache (speczoo/slots.py) beside a single `Engine`, whose target, drafters,
costs and request validation it uses. `submit(request)` validates now (errors raise before anything
runs) and queues a `BatchedRequest`; each `step()` admits queued sequences into free slots, first come first
served (a slot already holding a prefix of the prompt, or another slot's copy of it: SlotCache.acquire),
and runs one forward over:
  * the next chunk of each prompt still being prefilled past that prefix, `chunk` prompt rows per step in all (first come
    first served), so a long prompt does not stall the streams that already decode;
  * every other sequence's round: [a0] + its draft, a chain or a token tree, from round.plan.
After the forward each sequence judges its own logits rows with the same code as the single engine
(decoding/engine.py's `conclude`: greedy, or rejection sampling with its own generator), rolls back its own slot and
settles the round (round.settle); the `Round`s, and a `Finished` at the end, wait in its `events`. A
cancelled sequence leaves at the next step and frees its slot.

Exactness: rows of different sequences never see each other (SlotCache's keys), and on the
batch-invariant kernels every row's logits are the bits of the same sequence run alone, prefilled in
one piece or in chunks; a sequence's plan, verify and settle run the solo engine's code in the solo
order. So every sequence emits exactly the ids of its solo `Engine` run, and a seeded sampled one the
same samples, whatever joins or leaves around it (tests/decoding/test_batch.py).

Pricing: a greedy (or unseeded) sequence's controller sees its round's price on top of the step's
other rows (decoding/pricing/batch_view.py). A seeded sampled sequence keeps the loaded profile, as alone:
its samples depend on which draft tokens meet which random numbers, and must not depend on the batch. Each step runs
at the thread count of the engine's steering (speczoo/threads.py), which times the step's decode forward;
a forward in a try of another count is not priced.

Limits, from each drafter's descriptor (decoding/drafters/registry.py): a batchable drafter that keeps
its state per request runs in a batch by name (prompt lookup). A batchable one whose factories share one
cache across requests (the draft model) is lent to one sequence at a time (`lease`): the first greedy
`auto` sequence admitted while no other holds it, until it leaves. It drafts for that sequence alone,
priced like any drafter on top of the step's other rows, so the controller drops it as the batch grows;
a lone client gets the same speculation as from the single engine. Greedy only: a greedy sequence's ids
are the target's whatever it drafts with, while a sampled one's samples would depend on whether the
lease was free. A drafter that is not batchable (EAGLE, which reads the target's features) and an
explicit mode of a lent one are refused with a clear error, so features of the target (FeatureTaps) are
never needed here. Sliding-window models (Gemma 3) cannot use
a SlotCache (its constructor says so). This module never detokenizes and is not thread-safe: one
thread calls submit, step and cancel.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from speczoo.models.forward import Readout
from speczoo.request import GenerationRequest
from speczoo.slots import Feed, SlotCache, forward_batch
from speczoo.decoding.pricing.batch_view import batch_view
from speczoo.decoding.engine import Engine, conclude, first_token
from speczoo.decoding.modes import AUTO, OFF, SpecMode
from speczoo.decoding.round import Finished, Generation, RoundPlan, Round, plan, settle
from speczoo.decoding.verify.tree import TreeLayout
from speczoo.decoding.tuning import BATCHING
from speczoo.decoding.types import MAX_K


@dataclass(eq=False)
class BatchedRequest:
    """One request in the batch. events: what its steps produced and the consumer has not taken yet
    (Rounds, then one Finished); done: it finished or was cancelled, and holds no slot."""

    request: GenerationRequest
    g: Generation
    number: int
    slot: int = -1
    fed: int = 0                       # prompt ids in its slot so far
    reused: int = 0                    # of those, the prefix found in the cache at admission (not computed)
    events: deque = field(default_factory=deque)
    cancelled: bool = False
    done: bool = False
    admitted: float = 0.0              # when it got its slot
    first_at: float | None = None      # when its first token (a0) was known

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.request.prompt_ids)

    def cancel(self) -> None:
        """Leave at the next step (or never start); no Finished follows. Its stats cover what ran."""
        if not self.cancelled and not self.done:
            self.cancelled = True
            self.close_stats()

    def close_stats(self) -> None:
        """The stats of the generation as it stands: decode seconds since its first token, new tokens."""
        stats = self.g.stats
        if self.first_at is not None:
            stats.seconds = time.perf_counter() - self.first_at
        stats.new_tokens = len(self.g.out)

    def take(self) -> list[Round | Finished]:
        out = list(self.events)
        self.events.clear()
        return out


class _Slot:
    """One slot of a SlotCache as the rollback of `conclude` (decoding/engine.py) sees it."""

    def __init__(self, cache: SlotCache, slot: int):
        self.cache, self.slot = cache, slot

    def truncate(self, n: int) -> None:
        self.cache.truncate(self.slot, n)

    def compact(self, src: list[int], dst: int) -> None:
        self.cache.compact(self.slot, src, dst)


@dataclass
class _Work:
    """One sequence's part of a step: its feed, where its logits rows start, and what it does with them."""

    seq: BatchedRequest
    feed: Feed
    logits_at: int = -1                # first of its rows in the forward's logits (-1: needs none)
    plan: RoundPlan | None = None      # a round (None: a prompt chunk)
    layout: TreeLayout | None = None
    base: int = 0                      # its slot's length before the forward
    logits: Tensor | None = None       # its rows' logits [n, V] once the forward ran


class BatchEngine:
    """engine: the single engine whose target, drafters and costs the batch shares (its drafters'
    descriptors say which run here by name and which are lent); slots: the SlotCache of the batch (each
    slot holds engine.max_seq + MAX_K + 1 tokens at least); chunk: prompt rows per step (Batching.chunk)."""

    def __init__(self, engine: Engine, slots: SlotCache, chunk: int = BATCHING.chunk):
        if slots.slot_capacity < engine.max_seq + MAX_K + 1:
            raise ValueError(f"a slot holds {slots.slot_capacity} tokens; a request may need "
                             f"{engine.max_seq + MAX_K + 1} (max_seq + a verify of MAX_K + 1 rows)")
        if chunk < 1:
            raise ValueError(f"the prefill chunk must be >= 1 row, got {chunk}")
        self.engine, self.slots, self.chunk = engine, slots, chunk
        self.waiting: deque[BatchedRequest] = deque()
        self.running: list[BatchedRequest] = []
        self.lease: BatchedRequest | None = None      # the sequence the lent drafters draft for
        self._numbers = itertools.count()
        self.steps = 0
        self.rows = 0                   # rows of the last forward
        self.size = 0                   # sequences in the last forward

    @property
    def batchable(self) -> frozenset[str]:
        """The drafters a batch runs by name: those that keep all their state per request."""
        return frozenset(n for n, s in self.engine.drafters.items() if s.by_name_in_batch)

    @property
    def leased(self) -> frozenset[str]:
        """The drafters the batch lends to one greedy `auto` sequence at a time (one cache across requests)."""
        return frozenset(n for n, s in self.engine.drafters.items() if s.leased)

    @property
    def spec_modes(self) -> list[str]:
        return [OFF, *[d for d in self.engine.drafters if d in self.batchable], AUTO]

    def submit(self, req: GenerationRequest) -> BatchedRequest:
        """Validate now (errors raise here) and queue; it joins at a step with a free slot."""
        seq = BatchedRequest(req, self.engine.open(req, self.batchable), next(self._numbers))
        self.waiting.append(seq)
        return seq

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def step(self) -> list[BatchedRequest]:
        """Admit, run one forward for every running sequence, settle; returns the sequences with new
        events (finished ones included)."""
        self._leave(s for s in self.running if s.cancelled)
        for seq in [s for s in self.waiting if s.cancelled]:
            self.waiting.remove(seq)
            seq.done = True
        while self.waiting and self.slots.free:
            seq = self.waiting.popleft()
            seq.slot, seq.admitted = self.slots.acquire(seq.request.prompt_ids), time.perf_counter()
            seq.fed = seq.reused = self.slots.lengths[seq.slot]      # a prompt prefix some slot held already
            self._lend(seq)
            self.running.append(seq)
        if not self.running:
            return []
        touched: list[BatchedRequest] = []
        self.rows = self.size = 0
        steer = self.engine.steer          # the thread count for this step's drafting and forward
        if steer is not None:
            steer.begin()
        try:
            work = self._prompt_chunks()
            self._rounds(work, touched)
            if work:
                self._forward(work)
                for w in work:
                    self._conclude(w)
                    touched.append(w.seq)
        finally:
            if steer is not None:
                steer.end()
        self._leave(s for s in self.running if s.g.finish is not None)
        self.steps += 1
        return list(dict.fromkeys(touched))

    # -- one step ---------------------------------------------------------------------------
    def _prompt_chunks(self) -> list[_Work]:
        """The next prompt chunk of each prefilling sequence, oldest first, within `chunk` rows."""
        work, budget = [], self.chunk
        for seq in self.running:
            if not seq.prefilling or budget == 0:
                continue
            ids = seq.request.prompt_ids[seq.fed:seq.fed + budget]
            budget -= len(ids)
            work.append(_Work(seq, Feed(seq.slot, ids)))
        return work

    def _rounds(self, work: list[_Work], touched: list[BatchedRequest]) -> None:
        """Plan every decoding sequence's round (each priced on top of the step's other rows); the last
        token of a budget is settled at once, without a row."""
        decoding = [s for s in self.running if not s.prefilling and s.g.finish is None]
        rows = sum(len(w.feed.tokens) for w in work)
        base = self._costs()
        for i, seq in enumerate(decoding):
            g = seq.g
            if base is not None and (g.sampling.greedy or g.sampling.seed is None):
                others = rows + len(decoding) - 1 - i                 # later sequences: one row at least
                g.policy.use_costs(batch_view(base, others, len(decoding) - 1, seq.request.k + 1))
            p = plan(g)
            if not p.verify:
                seq.events.append(settle(g, p, None, 0))
                touched.append(seq)
                continue
            tokens = [g.pending] + p.draft.tokens
            parents = None if p.chain else [-1] + [q + 1 for q in p.draft.parents]
            layout = None if p.chain else TreeLayout.from_parents(p.draft.parents)
            work.append(_Work(seq, Feed(seq.slot, tokens, parents), plan=p, layout=layout,
                              base=self.slots.lengths[seq.slot]))
            rows += len(tokens)

    def _costs(self):
        """The costs the batch prices rounds from: calibrated where the engine calibrates, else as loaded."""
        meter = self.engine.meter
        return meter.costs() if meter is not None else self.engine.costs

    def _forward(self, work: list[_Work]) -> None:
        """One target forward over every feed; logits only for the rows someone reads."""
        want: list[int] = []
        at = 0
        for w in work:
            n = len(w.feed.tokens)
            if w.plan is not None:
                w.logits_at = len(want)
                want += range(at, at + n)
            elif w.seq.fed + n == len(w.seq.request.prompt_ids):      # a prompt's last chunk: its last row
                w.logits_at = len(want)
                want.append(at + n - 1)
            at += n
        prefill = any(w.plan is None for w in work)
        t = time.perf_counter()
        out, _ = forward_batch(self.engine.target, self.slots, [w.feed for w in work],
                               Readout(logit_rows=torch.tensor(want or [at - 1], dtype=torch.long)))
        seconds = time.perf_counter() - t
        steer, meter = self.engine.steer, self.engine.meter
        settled = steer.timed(at, seconds) if steer is not None and not prefill else True
        if meter is not None and not prefill and settled:   # a decode step's time: c_v of the step's rows
            meter.forward(at, seconds)
        self.rows, self.size = at, len(work)
        for w in work:
            if w.logits_at >= 0:
                n = 1 if w.plan is None else len(w.feed.tokens)
                w.logits = out.logits[w.logits_at:w.logits_at + n]       # [n, V]

    def _conclude(self, w: _Work) -> None:
        seq, g = w.seq, w.seq.g
        if w.plan is None:
            seq.fed += len(w.feed.tokens)
            if not seq.prefilling:
                first_token(g, w.logits)
                for d in g.drafters.values():
                    d.prefill(g.context)
                seq.first_at = time.perf_counter()
                g.stats.prefill_seconds = seq.first_at - seq.admitted     # its chunks, interleaved with others' steps
            return
        verdict, judged = conclude(g, w.plan, w.logits, [], _Slot(self.slots, seq.slot), w.base, w.layout)
        seq.events.append(settle(g, w.plan, verdict, judged))

    def _lend(self, seq: BatchedRequest) -> None:
        """Lend the drafters that share one cache (the draft model) to a sequence just admitted, when no
        other holds them and it decodes greedily in `auto`: its generation is built again with them among
        its drafters (nothing of it has run yet)."""
        req, leased = seq.request, self.leased
        if (self.lease is not None or not leased or not req.sampling.greedy
                or SpecMode.parse(req.spec, offered=self.engine.drafters).mode != AUTO):
            return
        seq.g = self.engine.open(req, self.batchable | leased)
        self.lease = seq

    def _leave(self, gone) -> None:
        """Sequences that finished or were cancelled give their slot (and the draft model) back; a
        finished one says so."""
        for seq in list(gone):
            self.running.remove(seq)
            if self.lease is seq:
                self.lease = None
            self.slots.release(seq.slot)
            seq.slot, seq.done = -1, True
            seq.g.end()
            if not seq.cancelled:
                seq.close_stats()
                seq.events.append(seq.g.result())
