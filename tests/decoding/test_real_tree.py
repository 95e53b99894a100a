"""Token trees on a real small model (qwen2.5-coder-0.5b on its fast backend): greedy stays lossless.

The fast backend's forward is batch-invariant for tree rows too, so tree verification plus compaction
must reproduce plain greedy token for token.
"""

import pytest

from speczoo.bench.ab import run_ab
from speczoo.bench.prompts import builtin_prompt
from speczoo.request import GenerationRequest
from speczoo.decoding.drafters.registry import DrafterSpec
from speczoo.decoding.engine import Engine
from speczoo.decoding.round import Finished
from speczoo.runtime import Runtime, load
from hand_tree import ScriptedTree

pytestmark = pytest.mark.real
MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module")
def runtime():
    return Runtime(load(MODEL), max_seq=2048)


def test_ngram_tree_equals_greedy_on_code_edit(runtime):
    ids = runtime.chat_ids([{"role": "user", "content": builtin_prompt("code_edit").message}])
    res = run_ab(runtime, ids, "ngram-tree", k=16, gen=40, runs=1, warmup=False)
    assert res.lossless, "\n".join(res.lines())
    assert res.accepted_per_round > 1.0


def test_bushy_trees_with_off_branch_paths_stay_lossless(runtime):
    """Trees that hide the true continuation among wrong branches (16 nodes): the accepted path is
    usually not the first branch, so the compaction moves real K/V rows."""
    ids = runtime.chat_ids([{"role": "user", "content": "Write a Python function that reverses a string."}])
    *_, plain = runtime.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=32))
    drafter = ScriptedTree(ids + plain.ids, vocab=runtime.target.args.vocab_size, seed=3)
    engine = Engine(runtime.engine.target, runtime.engine.cache, [DrafterSpec("tree", lambda req: drafter)],
                    runtime.tokenizer.eos_ids, runtime.max_seq)      # no cost model: every round K = 16
    *_, done = engine.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=32, spec="tree", k=16))
    assert isinstance(done, Finished)                             # the engine's own end: ids, no text
    assert done.ids == plain.ids
    assert done.stats.accepted > 8
    assert any(p and p != list(range(len(p))) for p in drafter.paths)
