"""Grammar-constrained decoding on the real qwen2.5-coder-0.5b (drafting for itself, so the draft model
runs too): every speculative mode the runtime offers, alone and in a batch, emits exactly the ids of
constrained plain greedy, and the text matches the schema."""

import json

import pytest
import torch

from speczoo.events import DoneEvent
from speczoo.request import Constraint, GenerationRequest
from speczoo.runtime import Runtime, load

pytestmark = pytest.mark.real
MODEL = "qwen2.5-coder-0.5b"
CITIES = {"type": "object", "additionalProperties": False, "required": ["cities"], "properties": {
    "cities": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "additionalProperties": False, "required": ["name", "country", "population"],
        "properties": {"name": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30},
                       "population": {"type": "integer"}}}}}}


@pytest.fixture(scope="module")
def runtime():
    loaded = load(MODEL)
    return Runtime(loaded, draft=loaded, max_seq=1024)


def done_of(events) -> DoneEvent:
    return [e for e in events if isinstance(e, DoneEvent)][-1]


def test_every_mode_alone_and_batched_equals_constrained_greedy(runtime):
    ids = runtime.chat_ids([{"role": "user", "content": "List Paris, Rome and Madrid with country and population as JSON."}])
    constraint = Constraint("json_schema", json.dumps(CITIES))
    modes = [m for m in runtime.spec_modes if m != "off"]
    reqs = [GenerationRequest(ids, 90, spec=m, constraint=constraint) for m in ["off", *modes]]
    with torch.no_grad():
        alone = [done_of(runtime.generate(r)) for r in reqs]
    ref = alone[0]
    assert ref.finish_reason == "stop" and len(json.loads(ref.text)["cities"]) == 3, ref.text
    for req, done in zip(reqs, alone):
        assert done.ids == ref.ids, req.spec
    assert sum(d.stats.accepted for d in alone[1:]) > 0
    batch = runtime.batch(3)
    seqs = [batch.submit(r) for r in reqs if r.spec in batch.spec_modes]
    ends = {}
    with torch.no_grad():
        while batch.busy:
            for seq, events in batch.step():
                ends.update({seq: e for e in events if isinstance(e, DoneEvent)})
    assert seqs and all(ends[s].ids == ref.ids for s in seqs)
