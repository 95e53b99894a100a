"""Continuous batching on the real 0.5B (pulled by .ci/run): every request of a batch streams exactly the
events it streams alone through `Runtime.generate`, whatever the batch's composition (who joins when,
how many slots, how long the prompt chunks)."""

import pytest

from speczoo.bench.prompts import builtin_prompt
from speczoo.events import DoneEvent
from speczoo.request import GenerationRequest, SamplingParams
from real_models import real_runtime

pytestmark = pytest.mark.real


def requests(rt) -> list[GenerationRequest]:
    ids = {name: rt.chat_ids([{"role": "user", "content": builtin_prompt(name).message}])
           for name in ("code_edit", "verbatim", "free_form")}
    return [GenerationRequest(prompt_ids=ids["code_edit"], max_new_tokens=40, spec="ngram"),
            GenerationRequest(prompt_ids=ids["free_form"], max_new_tokens=24, spec="off"),
            GenerationRequest(prompt_ids=ids["verbatim"], max_new_tokens=40, spec="auto"),
            GenerationRequest(prompt_ids=ids["code_edit"], max_new_tokens=32, spec="ngram-tree"),
            GenerationRequest(prompt_ids=ids["free_form"], max_new_tokens=24, spec="ngram",
                              sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=11))]


def batched(rt, reqs, n_slots: int, chunk: int, order: list[int]) -> dict[int, list]:
    batch = rt.batch(n_slots, chunk)
    seqs = {}
    got: dict[int, list] = {}
    pending = list(order)
    while pending or batch.busy:
        if pending:                                   # one joins per step: the batch changes as it runs
            i = pending.pop(0)
            seqs[batch.submit(reqs[i])] = i
        for seq, events in batch.step():
            got.setdefault(seqs[seq], []).extend(events)
    return got


def same(events, alone, rounds: bool) -> bool:
    """The same text, ids and finish; with `rounds` (a seeded sample, priced as alone) the same events.
    A greedy request's rounds may differ: in a batch its speculation is priced on the batch's rows."""
    a, b = events[-1], alone[-1]
    assert isinstance(a, DoneEvent) and isinstance(b, DoneEvent)
    if rounds and events[:-1] != alone[:-1]:
        return False
    return ("".join(e.text for e in events[:-1]) == "".join(e.text for e in alone[:-1])
            and (a.text, a.ids, a.finish_reason) == (b.text, b.ids, b.finish_reason))


def test_batched_requests_equal_their_solo_runs_in_any_composition():
    rt = real_runtime()
    reqs = requests(rt)
    alone = [list(rt.generate(r)) for r in reqs]
    for n_slots, chunk, order in [(5, 64, [0, 1, 2, 3, 4]), (2, 16, [4, 2, 0, 3, 1])]:
        got = batched(rt, reqs, n_slots, chunk, order)
        for i in range(len(reqs)):
            assert same(got[i], alone[i], not reqs[i].sampling.greedy), f"request {i} ({reqs[i].spec}) with {n_slots} slots, chunk {chunk}"


def test_a_parallel_server_streams_concurrent_answers_equal_to_solo():
    """`speczoo serve --parallel 3` on the 0.5B: three concurrent streams through the openai client, each
    equal to the same request served alone by the one-at-a-time server."""
    import concurrent.futures as cf

    import openai

    from speczoo.serve.app import create_app
    from speczoo.serve.background import BackgroundServer
    from speczoo.serve.batch_worker import BatchWorker

    rt = real_runtime()
    asks = [("Write a Python function that reverses a string.", "ngram"), ("What is a KV cache?", "off"),
            ("Rename x to total in: def f(x): return x + x", "auto")]

    def ask(url: str, text: str, spec: str) -> str:
        with openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=300) as client:
            parts = client.chat.completions.create(model=rt.name, messages=[{"role": "user", "content": text}],
                                                   max_tokens=32, stream=True, extra_body={"speculative": spec})
            return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)

    with BackgroundServer(create_app(rt)) as solo:
        alone = [ask(solo.url, t, s) for t, s in asks]
    with BackgroundServer(create_app(rt, worker=BatchWorker(rt, 3))) as batch, cf.ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda a: ask(batch.url, *a), asks))
    assert together == alone and all(alone)
