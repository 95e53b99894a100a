"""Presence and frequency penalties per verify row (decoding/penalties.py): the rows count the output,
a0 and the draft tokens before them; every speculative mode with penalties emits the ids of plain
decoding with penalties, on a tiny random qwen2, alone and in the batch."""

from __future__ import annotations

import random

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.slots import SlotCache
from speczoo.decoding.batch import BatchEngine
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.engine import MAX_K, Engine
from speczoo.decoding.penalties import row_penalties
from offered import offered
from tiny import tiny_model

MAX_SEQ = 160


def test_each_row_counts_the_output_a0_and_the_draft_before_it():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    p = row_penalties([1, 1, 2], [2, 3], params, 5)
    for r, prefix in enumerate([[1, 1, 2], [1, 1, 2, 2], [1, 1, 2, 2, 3]]):
        want = [0.5 * (prefix.count(t) > 0) + 0.25 * prefix.count(t) for t in range(5)]
        assert p[r].tolist() == pytest.approx(want)


def test_penalties_out_of_range_are_refused():
    with pytest.raises(ValueError, match="presence_penalty"):
        SamplingParams(presence_penalty=2.5).validate()
    with pytest.raises(ValueError, match="frequency_penalty"):
        SamplingParams(frequency_penalty=-3).validate()


@pytest.mark.parametrize("presence, frequency", [(0.8, 0.0), (0.0, 0.6), (-0.5, 1.5)])
def test_every_mode_with_penalties_emits_the_ids_of_plain_decoding_with_them(presence, frequency, one_thread):
    model, args = tiny_model("qwen2", seed=4)
    drafters = offered({"ngram": lambda r: NgramDrafter(r.ngram), "ngram-tree": lambda r: NgramTreeDrafter(r.ngram)})
    eng = Engine(model, KVCache(args, MAX_SEQ, extra=MAX_K + 1), drafters, [], MAX_SEQ)
    rng = random.Random(7)
    prompt = [rng.randrange(16) for _ in range(9)] * 4
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency)

    def run(spec, k=4, sampling=params):
        with torch.no_grad():
            *_, done = eng.generate(GenerationRequest(prompt, 40, sampling=sampling, spec=spec, k=k))
        return done.ids

    ref = run("off")
    assert ref != run("off", sampling=SamplingParams())            # the penalties change the text
    for spec in ["ngram", "ngram-tree", "auto"]:
        for k in (1, 4, 8):
            assert run(spec, k) == ref, (spec, k)
    reqs = [GenerationRequest(prompt, 40, sampling=params, spec=s, k=4) for s in ["ngram", "off", "ngram-tree"]]
    batch = BatchEngine(eng, SlotCache(args, 2, MAX_SEQ + MAX_K + 1), chunk=8)
    seqs = [batch.submit(r) for r in reqs]
    with torch.no_grad():
        while batch.busy:
            batch.step()
    assert all(s.g.out == ref for s in seqs)
