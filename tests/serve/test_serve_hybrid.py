"""`speczoo serve`'s app on a hybrid model: a tiny random LFM2 GGUF written as llama.cpp's converter writes
it, pulled (`speczoo pull PATH`), loaded as the CLI loads it, and served one request at a time and in a
batch (--parallel 2): every speculative mode answers exactly what plain greedy answers."""

from __future__ import annotations

import dataclasses

import pytest
from fastapi.testclient import TestClient

from speczoo.decoding.engine import Engine
from speczoo.request import GenerationRequest
from speczoo.runtime import load_runtime
from speczoo.serve.app import create_app
from speczoo.serve.batch_worker import BatchWorker
from speczoo.zoo.pull import pull
from tiny_gguf import write_arch_gguf

PROMPT = [260, 261, 72, 101, 260, 261, 72, 101, 260, 261, 9]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECZOO_HOME", str(tmp_path_factory.mktemp("home")))
        path, _, _ = write_arch_gguf(tmp_path_factory.mktemp("gguf") / "tiny-lfm2.gguf", "lfm2", "mixed",
                                     ffn_dim=256, seed=3)
        pull(str(path), progress=False, log=lambda m: None)
        yield load_runtime(str(path), max_seq=256)


def completion(client, runtime, spec: str) -> dict:
    r = client.post("/v1/completions", json={"model": runtime.name, "prompt": PROMPT, "max_tokens": 40,
                                             "temperature": 0, "speculative": spec})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_every_mode_answers_what_greedy_answers(runtime):
    assert runtime.target.args.conv_layers and runtime.cannot_batch() is None
    modes = runtime.spec_modes
    assert {"off", "ngram", "auto"} <= set(modes)
    with TestClient(create_app(runtime)) as client:
        plain = completion(client, runtime, "off")
        for spec in modes:
            assert completion(client, runtime, spec) == plain, spec
    with TestClient(create_app(runtime, worker=BatchWorker(runtime, 2))) as client:
        for spec in ("off", "ngram", "auto"):
            assert completion(client, runtime, spec) == plain, f"{spec} in a batch"
    # the same target without costs drafts every round whatever the machine's speed (the served controller's
    # choices follow its timings): prompt lookup drafts, some of it is rolled back, and the ids are greedy's
    spec = dataclasses.replace(runtime.engine.drafters["ngram"], cost=None)
    eng = Engine(runtime.engine.target, runtime.engine.cache, [spec], runtime.tokenizer.eos_ids, runtime.max_seq)
    outs = {mode: list(eng.generate(GenerationRequest(prompt_ids=PROMPT, max_new_tokens=40, spec=mode, k=8)))[-1]
            for mode in ("off", "ngram")}
    assert outs["ngram"].ids == outs["off"].ids
    assert outs["ngram"].stats.drafted > outs["ngram"].stats.accepted > 0
