"""The real qwen2.5-coder-0.5b on every SIMD kernel path this CPU can run besides the one it would choose
(on an AVX-512 machine the forced AVX2 build stands in for an AVX2-only CPU): the forward is batch-invariant,
speculative decoding equals greedy, and greedy gives the very tokens of the chosen path, since every path
computes the scalar reference's bits."""

import pytest
import torch

from speczoo.bench.ab import run_ab
from speczoo.bench.prompts import builtin_prompt
from speczoo.cache import KVCache
from speczoo.events import DoneEvent
from speczoo.request import GenerationRequest
from speczoo.kernels import native
from speczoo.runtime import Runtime, load

pytestmark = pytest.mark.real
MODEL = "qwen2.5-coder-0.5b"
CHOSEN = native.runnable_paths()[0]
OTHERS = [p for p in native.runnable_paths() if p.simd and p != CHOSEN]


def _greedy(rt: Runtime, ids: list[int], n: int) -> list[int]:
    *_, done = rt.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=n))
    assert isinstance(done, DoneEvent)
    return done.ids


@pytest.fixture(scope="module")
def reference():
    rt = Runtime(load(MODEL), max_seq=1024)
    ids = rt.chat_ids([{"role": "user", "content": builtin_prompt("code_edit").message}])
    return ids, _greedy(rt, ids, 32)


@pytest.mark.skipif(not OTHERS, reason=f"this CPU runs one SIMD path only ({CHOSEN.name})")
@pytest.mark.parametrize("path", OTHERS, ids=[p.name for p in OTHERS])
def test_the_real_model_on_a_forced_path(path, reference, monkeypatch):
    monkeypatch.setenv(native.PATH_ENV, path.name)
    loaded = load(MODEL)
    assert loaded.model.layers[0].native.lib.path_name == path.name
    args, model = loaded.args, loaded.model
    t = torch.tensor([(i * 7919) % 5000 + 100 for i in range(24)])
    with torch.inference_mode():
        whole = model(t, torch.arange(24), KVCache(args, 64)).logits
        c, parts, at = KVCache(args, 64), [], 0
        for s in (1, 5, 9, 2, 1, 6):
            parts.append(model(t[at:at + s], torch.arange(at, at + s), c).logits)
            at += s
    assert torch.equal(torch.cat(parts), whole), "batch invariance"
    rt = Runtime(loaded, max_seq=1024)
    ids, chosen_tokens = reference
    res = run_ab(rt, ids, "ngram", k=8, gen=32, runs=1, warmup=False)
    assert res.lossless, "\n".join(res.lines())
    assert res.greedy_ids == chosen_tokens, f"{path.name} greedy differs from {CHOSEN.name}"
