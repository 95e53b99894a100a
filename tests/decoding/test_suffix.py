"""The suffix drafter (decoding/drafters/suffix.py): it drafts the most frequent continuation of the longest
match in its own ids and its tenant's memory, as long as the match's length and the continuation's
frequency warrant; a request under one key never drafts another key's text; and speculation with it
(by name, under `auto`, alone and in a batch) emits exactly plain greedy's ids, while a repeated request
gets more of its draft accepted the second time (tiny model, and the real 0.5B through the runtime)."""

from __future__ import annotations

import random
import uuid
from types import SimpleNamespace

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.decoding.batch import BatchEngine
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.registry import SUFFIX
from speczoo.decoding.drafters.suffix import SuffixDrafter
from speczoo.decoding.drafters.suffix_memory import SuffixMemory
from speczoo.decoding.engine import MAX_K, Engine
from speczoo.decoding.round import Finished, Round
from speczoo.decoding.tuning import DRAFTING
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.slots import SlotCache
from offered import offered
from tiny import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py
MAX_SEQ = 160


def drafter(memory: SuffixMemory, prompt: list[int], tenant: str | None = None, **req) -> SuffixDrafter:
    """The drafter the registry's descriptor builds over `memory` for a request of `prompt`."""
    spec = SUFFIX.bound(SimpleNamespace(suffix_memory=memory))
    return spec.factory(GenerationRequest(prompt_ids=prompt, tenant=tenant, **req))


def test_it_drafts_from_its_own_ids_like_prompt_lookup():
    d = drafter(SuffixMemory(), [])
    ctx = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]
    assert d.situation(ctx) == "2-3/agree" and d.propose(ctx, 8).tokens == [8, 9, 1]    # 3 = its match's length


def test_a_repeated_request_is_drafted_from_the_remembered_answer():
    memory, prompt, answer = SuffixMemory(), [1, 2, 3, 4, 5], list(range(10, 40))
    first = drafter(memory, prompt)
    assert first.situation(prompt + [10]) is None
    first.finish(prompt + answer)
    again = drafter(memory, prompt)
    ctx = prompt + answer[:1]
    assert again.situation(ctx) == "4-7/agree" and again.propose(ctx, 16).tokens == answer[1:7]   # match 6 → 6
    ctx = prompt + answer[:12]
    assert again.situation(ctx) == "8+/agree" and again.propose(ctx, 16).tokens == answer[12:28]


def test_it_drafts_the_most_frequent_continuation_and_stops_where_it_gets_rare():
    memory, lead = SuffixMemory(), [1, 2, 3, 4]
    for tail in ([7, 8, 9], [7, 8, 9], [7, 5, 6]):               # [7, 5, 6] is the most recent
        memory.remember(None, lead + tail)
    d = drafter(memory, [])
    assert d.situation(lead) == "4-7/agree" and d.propose(lead, 8).tokens == [7, 8, 9]
    rare = SuffixDrafter(memory.open(None), 0, drafting=DRAFTING.__class__(suffix_min_prob=0.7))
    assert rare.propose(lead, 8).tokens == [7]                   # 8 follows 2 of 3: under 0.7, it stops


def test_a_request_under_one_key_never_drafts_another_keys_text():
    memory, prompt, answer = SuffixMemory(), [1, 2, 3, 4, 5], list(range(10, 30))
    drafter(memory, prompt, tenant="key-b").finish(prompt + answer)
    ctx = prompt + answer[:3]
    a = drafter(memory, prompt, tenant="key-a")
    assert a.situation(ctx) is None and a.propose(ctx, 8).tokens == []
    assert drafter(memory, prompt, tenant=None).situation(ctx) is None          # no key is a tenant too
    assert drafter(memory, prompt, tenant="key-b").propose(ctx, 8).tokens == answer[3:11]
    pooled = SuffixMemory(pooled=True)
    drafter(pooled, prompt, tenant="key-b").finish(prompt + answer)
    assert drafter(pooled, prompt, tenant="key-a").propose(ctx, 8).tokens == answer[3:11]


def test_a_seeded_sampled_request_reads_and_writes_no_memory():
    memory, prompt, answer = SuffixMemory(), [1, 2, 3, 4, 5], list(range(10, 30))
    drafter(memory, prompt).finish(prompt + answer)
    seeded = drafter(memory, prompt, sampling=SamplingParams(temperature=0.7, seed=1))
    assert seeded.situation(prompt + answer[:3]) is None
    seeded.finish(prompt + [50, 51, 52])
    assert memory.open(None).occurrences((50, 51), 8) == []


def engine(memory: SuffixMemory, model, args) -> Engine:
    specs = offered({"ngram": lambda req: NgramDrafter(max_order=req.ngram)})
    specs.append(SUFFIX.bound(SimpleNamespace(suffix_memory=memory)))
    return Engine(model, KVCache(args, MAX_SEQ, extra=MAX_K + 1), specs, eos_ids=[], max_seq=MAX_SEQ)


def requests(spec: str) -> list[GenerationRequest]:
    rng = random.Random(5)
    prompts = [[rng.randrange(128) for _ in range(n)] for n in (9, 14, 6)]
    return [GenerationRequest(prompt_ids=p, max_new_tokens=40, spec=spec, k=6) for p in prompts * 2]  # each twice


def ids_and_accepted(eng: Engine, req: GenerationRequest) -> tuple[list[int], int]:
    *_, done = eng.generate(req)
    return done.ids, done.stats.accepted


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("qwen2", backend="fp32-rows", seed=3, tie_embeddings=False)    # untied: varied answers


@pytest.mark.parametrize("spec", ["suffix", "auto"])
def test_suffix_speculation_equals_plain_greedy_and_a_repeat_accepts_more(tiny, spec):
    model, args = tiny
    eng = engine(SuffixMemory(), model, args)
    with torch.no_grad():
        plain = [ids_and_accepted(eng, r)[0] for r in requests("off")]
        spec_runs = [ids_and_accepted(eng, r) for r in requests(spec)]
    assert [ids for ids, _ in spec_runs] == plain
    if spec == "suffix":
        firsts, repeats = spec_runs[:3], spec_runs[3:]
        assert all(again > first for (_, first), (_, again) in zip(firsts, repeats)), spec_runs


def test_suffix_speculation_in_a_batch_equals_plain_greedy(tiny):
    model, args = tiny
    eng = engine(SuffixMemory(), model, args)
    with torch.no_grad():
        plain = [ids_and_accepted(eng, r)[0] for r in requests("off")]
        batch = BatchEngine(eng, SlotCache(args, 3, MAX_SEQ + MAX_K + 1), chunk=8)
        runs = [batch.submit(r) for r in requests("suffix")[:3]]        # the first three at once,
        later: list = []
        events: dict[int, list] = {}
        while batch.busy:
            batch.step()
            if not later and all(s.done for s in runs):                   # then their repeats
                later = [batch.submit(r) for r in requests("suffix")[3:]]
                runs += later
            for i, s in enumerate(runs):
                events.setdefault(i, []).extend(s.take())
    done = [next(e for e in events[i] if isinstance(e, Finished)) for i in range(6)]
    assert [d.ids for d in done] == plain
    drafted = [sum(e.accepted for e in events[i] if isinstance(e, Round)) for i in range(6)]
    assert all(again > first for first, again in zip(drafted[:3], drafted[3:])), drafted


@pytest.mark.real
def test_a_repeated_request_gets_more_accepted_on_the_real_0_5b():
    from real_models import real_runtime

    rt = real_runtime()                         # shared by the session: a fresh tenant sees nothing earlier
    tenant = f"test-{uuid.uuid4()}"
    ids = rt.chat_ids([{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci "
                                                   "number, with a docstring."}])
    runs = []
    for spec in ("off", "suffix", "suffix"):
        *_, done = rt.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=64, spec=spec, tenant=tenant))
        runs.append(done)
    assert runs[1].ids == runs[0].ids == runs[2].ids
    assert runs[2].stats.accepted > runs[1].stats.accepted + 20, [r.stats for r in runs]


def test_in_a_batch_a_request_never_drafts_from_an_answer_that_finished_after_it_started(tiny):
    """Snapshot semantics: B finishes early with text that A reaches later; A's rounds in the batch are its
    rounds alone on the memory it started with, while B remembered before A starts does change them."""
    model, args = tiny
    a = requests("suffix")[1]
    with torch.no_grad():
        answer = ids_and_accepted(engine(SuffixMemory(), model, args), GenerationRequest(**{**vars(a), "spec": "off"}))[0]
        b = GenerationRequest(prompt_ids=a.prompt_ids + answer[:20], max_new_tokens=10, spec="suffix", k=6)
        alone = list(engine(SuffixMemory(), model, args).generate(a))[:-1]
        primed = engine(SuffixMemory(), model, args)
        ids_and_accepted(primed, b)
        after_b = list(primed.generate(a))[:-1]
        eng = engine(SuffixMemory(), model, args)
        batch = BatchEngine(eng, SlotCache(args, 2, MAX_SEQ + MAX_K + 1), chunk=64)
        seq_a, seq_b = batch.submit(a), batch.submit(b)
        events: list = []
        while batch.busy:
            batch.step()
            events += seq_a.take()
        assert seq_b.done and len(events) > 20
    assert [e for e in events if isinstance(e, Round)] == alone != after_b
