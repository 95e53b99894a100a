"""Text on top of the engine's rounds: the TokenEvent / DoneEvent stream that the CLI, chat, server and
benches consume, for one request alone (`generate_text`) or for many in one batch (`TextBatch`).

The engine emits ids only (decoding/round.py's `Round`); here each round's ids are detokenized once,
incrementally (textstream.py), and a stop string ends the generation: the engine's rounds are simply no
longer pulled (a batched sequence is cancelled, which frees its slot at the next step). The DoneEvent
then says "stop", and its ids are every id the rounds emitted (the last round's whole run, the stop
string's and any after it included), as its text ends before the stop string. Never touches a model
or a cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from speczoo.events import DoneEvent, TokenEvent
from speczoo.request import GenerationRequest
from speczoo.decoding.batch import BatchEngine, BatchedRequest
from speczoo.decoding.engine import Engine
from speczoo.decoding.round import Finished, Generation, Round
from speczoo.textstream import TextStream


class Text:
    """One request's text: its rounds become TokenEvents, its end a DoneEvent."""

    def __init__(self, tokenizer, req: GenerationRequest):
        self.stream = TextStream(tokenizer, req.stop)

    @property
    def stopped(self) -> bool:
        return self.stream.stopped

    def round(self, r: Round) -> list[TokenEvent]:
        text = self.stream.push(r.ids)
        if r.ids or text:
            return [TokenEvent(ids=r.ids, text=text, drafted=r.drafted, accepted=r.accepted, drafter=r.drafter,
                               logprobs=r.logprobs)]
        return []

    def done(self, g: Generation) -> list[TokenEvent | DoneEvent]:
        """The text held back, then the DoneEvent ("stop" when a stop string ended it)."""
        tail = self.stream.flush()
        done = g.result("stop" if self.stream.stopped else None)
        end = DoneEvent(finish_reason=done.finish_reason, text=self.stream.text, ids=done.ids, stats=done.stats,
                        logprobs=done.logprobs)
        return ([TokenEvent(ids=[], text=tail)] if tail else []) + [end]


def generate_text(engine: Engine, tokenizer, req: GenerationRequest) -> Iterator[TokenEvent | DoneEvent]:
    """Validate the request now (errors raise before any event), then stream its text events."""
    g = engine.open(req)
    return _events(engine, g, Text(tokenizer, req))


def _events(engine: Engine, g: Generation, text: Text) -> Iterator[TokenEvent | DoneEvent]:
    rounds = engine.rounds(g)
    try:
        for r in rounds:
            yield from text.round(r)
            if text.stopped:
                break
    finally:
        rounds.close()                      # the decode time is taken now, also when the consumer left early
    yield from text.done(g)


class TextBatch:
    """Many requests' text events from one BatchEngine: `submit` a request (validated now), call `step`
    while `busy`; each step returns, per request that moved, its new events (a DoneEvent last). A request
    whose stop string appeared leaves the batch at the next step; `cancel` drops one without a DoneEvent.

    check: the runtime's own validation of a request (e.g. its prompt ids against the vocabulary)."""

    def __init__(self, batch: BatchEngine, tokenizer, check: Callable[[GenerationRequest], None] = lambda r: None):
        self.batch, self.tokenizer, self.check = batch, tokenizer, check
        self._text: dict[BatchedRequest, Text] = {}

    @property
    def busy(self) -> bool:
        return self.batch.busy

    @property
    def spec_modes(self) -> list[str]:
        return self.batch.spec_modes

    @property
    def size(self) -> int:
        """Sequences in the last step's forward."""
        return self.batch.size

    @property
    def running(self) -> int:
        return len(self.batch.running)

    @property
    def waiting(self) -> int:
        return len(self.batch.waiting)

    def submit(self, req: GenerationRequest) -> BatchedRequest:
        self.check(req)
        seq = self.batch.submit(req)
        self._text[seq] = Text(self.tokenizer, req)
        return seq

    def cancel(self, seq: BatchedRequest) -> None:
        seq.cancel()
        self._text.pop(seq, None)

    def step(self) -> list[tuple[BatchedRequest, list[TokenEvent | DoneEvent]]]:
        out = []
        for seq in self.batch.step():
            text = self._text.get(seq)
            if text is None:
                continue
            events: list[TokenEvent | DoneEvent] = []
            for item in seq.take():
                if isinstance(item, Round) and not text.stopped:
                    events += text.round(item)
                if text.stopped or isinstance(item, Finished):
                    if text.stopped:
                        seq.cancel()                         # its slot is free at the next step
                    events += text.done(seq.g)
                    del self._text[seq]
                    break
            out.append((seq, events))
        return out
