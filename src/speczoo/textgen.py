"""Text on top of the engine's rounds: the TokenEvent / DoneEvent stream that the CLI, chat, server and
benches consume.

The engine emits ids only (decoding/round.py's `Round`); here each round's ids are detokenized once,
incrementally (textstream.py), and a stop string ends the generation: the engine's rounds are simply no
longer pulled. The DoneEvent then says "stop", and its ids are every id the rounds emitted (the last
round's whole run, the stop string's and any after it included), as its text ends before the stop
string. Never touches a model or a cache.
"""

from __future__ import annotations

from collections.abc import Iterator

from speczoo.events import DoneEvent, GenerationRequest, TokenEvent
from speczoo.decoding.engine import Engine
from speczoo.decoding.round import Generation
from speczoo.textstream import TextStream


def generate_text(engine: Engine, tokenizer, req: GenerationRequest) -> Iterator[TokenEvent | DoneEvent]:
    """Validate the request now (errors raise before any event), then stream its text events."""
    g = engine.open(req)
    return _events(engine, g, TextStream(tokenizer, req.stop))


def _events(engine: Engine, g: Generation, stream: TextStream) -> Iterator[TokenEvent | DoneEvent]:
    rounds = engine.rounds(g)
    finish = None
    try:
        for r in rounds:
            text = stream.push(r.ids)
            if r.ids or text:
                yield TokenEvent(ids=r.ids, text=text, drafted=r.drafted, accepted=r.accepted, drafter=r.drafter)
            if stream.stopped:
                finish = "stop"
                break
    finally:
        rounds.close()                      # the decode time is taken now, also when the consumer left early
    tail = stream.flush()
    if tail:
        yield TokenEvent(ids=[], text=tail)
    done = g.result(finish)
    yield DoneEvent(finish_reason=done.finish_reason, text=stream.text, ids=done.ids, stats=done.stats)
