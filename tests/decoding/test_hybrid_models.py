"""A hybrid model (tiny random LFM2: short convolutions and attention) through the engine with every drafter:
prompt lookup, its tree, a draft model (a hybrid target with a dense draft, and a dense target with a
hybrid draft, over one vocabulary), `auto`, and a batch: every output is the target's plain greedy, on the
batch-invariant backends (fp32 rows, and the compiled q8 kernels)."""

from types import SimpleNamespace

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.request import GenerationRequest
from speczoo.slots import SlotCache
from speczoo.decoding.batch import BatchEngine
from speczoo.decoding.drafters.draft_model import make_draft_drafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.engine import MAX_K, Engine
from speczoo.decoding.round import Finished
from offered import offered
from tiny import greedy, tiny_model

MAX_SEQ = 160
PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1, 5], [7, 7, 2, 9] * 4, [11, 3, 5, 8, 13, 21]]


def engine(target: str, draft: str, backend: str):
    """An engine over a tiny `target` offering prompt lookup, its tree and a tiny `draft` model (vocab 32)."""
    t_model, t_args = tiny_model(target, backend=backend, vocab=32, seed=1)
    d_model, d_args = tiny_model(draft, backend=backend, vocab=32, seed=2, n_layers=2)
    loaded = [SimpleNamespace(model=m, args=a) for m, a in ((d_model, d_args), (t_model, t_args))]
    drafters = {"ngram": lambda req: NgramDrafter(req.ngram), "ngram-tree": lambda req: NgramTreeDrafter(req.ngram),
                "draft": make_draft_drafter(*loaded, MAX_SEQ + MAX_K + 1, head_vocab=None)}
    eng = Engine(t_model, KVCache(t_args, MAX_SEQ, extra=MAX_K + 1), offered(drafters), eos_ids=[], max_seq=MAX_SEQ)
    return eng, t_model, t_args


@pytest.mark.parametrize("backend", ["fp32-rows", "q8"])
@pytest.mark.parametrize("target,draft", [("lfm2", "qwen3"), ("qwen3", "lfm2"), ("lfm2", "lfm2")])
def test_every_mode_equals_greedy(target, draft, backend):
    eng, model, args = engine(target, draft, backend)
    rolled = 0
    with torch.no_grad():
        for prompt in PROMPTS:
            want = greedy(model, args, torch.tensor(prompt), 48)
            for spec in ("off", "ngram", "ngram-tree", "draft", "auto"):
                *rounds, done = eng.generate(GenerationRequest(prompt_ids=prompt, max_new_tokens=48, spec=spec, k=5))
                assert isinstance(done, Finished) and done.ids == want, f"{spec} on {prompt}"
                rolled += done.stats.drafted - done.stats.accepted
    assert rolled > 20, "the drafts were never rolled back"


def test_a_batch_of_hybrid_sequences_equals_their_solo_runs():
    eng, _, args = engine("lfm2", "qwen3", "fp32-rows")
    reqs = [GenerationRequest(prompt_ids=p, max_new_tokens=40, spec=spec, k=4)
            for p, spec in zip(PROMPTS, ("ngram", "ngram-tree", "auto"))]
    with torch.no_grad():
        alone = [[e for e in eng.generate(r)][-1].ids for r in reqs]
        batch = BatchEngine(eng, SlotCache(args, 2, MAX_SEQ + MAX_K + 1), chunk=5)
        seqs = [batch.submit(r) for r in reqs]
        while batch.busy:
            batch.step()
    assert [[e for e in s.take() if isinstance(e, Finished)][0].ids for s in seqs] == alone
