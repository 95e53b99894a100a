"""The reduced-vocabulary draft head and the strip selection it is built on: the kept ids get exactly
the full head's logits, every other id -inf, and drafting with it stays lossless."""

import pytest
import torch

from tiny import tiny_model

from speczoo.cache import KVCache
from speczoo.request import GenerationRequest
from speczoo.decoding.round import Finished
from speczoo.kernels.backends import get_backend
from speczoo.kernels.quantized import select_strips
from speczoo.decoding.drafters.draft_head import ReducedHead
from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.engine import Engine
from speczoo.models.forward import Readout
from offered import offered


@pytest.mark.parametrize("backend", ["q4", "q8"])
def test_selected_strips_compute_exactly_the_full_columns(backend):
    be = get_backend(backend)
    w = torch.randn(96, 300, generator=torch.Generator().manual_seed(0))
    full = be.build(be.pack(w), torch.randn(96))
    x = torch.randn(5, 300)
    y = full(x)                                                         # [5, 96]
    lead = select_strips(full, torch.arange(3))                         # outputs 0..47, shared memory
    assert lead.qs.data_ptr() == full.qs.data_ptr() if backend == "q4" else lead.w8.data_ptr() == full.w8.data_ptr()
    assert torch.equal(lead(x), y[:, :48])
    pick = select_strips(full, torch.tensor([5, 1]))                    # outputs 80..95 then 16..31
    assert torch.equal(pick(x), torch.cat((y[:, 80:96], y[:, 16:32]), dim=1))


def test_strip_selection_refuses_what_it_cannot_do():
    fp32 = get_backend("fp32")
    assert select_strips(fp32.build(fp32.pack(torch.randn(32, 16)), None), torch.arange(1)) is None
    q4 = get_backend("q4")
    mod = q4.build(q4.pack(torch.randn(32, 256)), None)
    with pytest.raises(ValueError, match="within"):
        select_strips(mod, torch.tensor([2]))
    with pytest.raises(ValueError, match="within"):
        select_strips(mod, torch.zeros(0, dtype=torch.long))


def test_reduced_head_keeps_common_and_prompt_ids_only():
    model, args = tiny_model("qwen2", backend="q4", vocab=256)
    head = ReducedHead(model, 64)
    t = torch.tensor([3, 200, 7])
    full = model(t, torch.arange(3), KVCache(args, 16)).logits
    red = model(t, torch.arange(3), KVCache(args, 16), readout=Readout(head=head)).logits
    assert torch.equal(red[:, :64], full[:, :64])
    assert torch.isneginf(red[:, 64:]).all()
    head.keep([5, 200, 131])                                           # strips 12 (192..207) and 8 (128..143)
    red = model(t, torch.arange(3), KVCache(args, 16), readout=Readout(head=head)).logits
    kept = torch.zeros(256, dtype=torch.bool)
    kept[:64] = kept[128:144] = kept[192:208] = True
    assert torch.equal(red[:, kept], full[:, kept])
    assert torch.isneginf(red[:, ~kept]).all()
    with pytest.raises(ValueError, match="compiled"):
        ReducedHead(tiny_model("qwen2", backend="fp32")[0], 64)


def test_pick_is_the_full_rows_argmax_with_its_probability():
    """pick() searches the kept ids only and must give the full row's argmax (ties: the lowest id, as
    torch.argmax) and, through the kept logits, the same softmax probability to round-off."""
    model, args = tiny_model("qwen2", backend="q4", vocab=256)
    head = ReducedHead(model, 64)
    for keep in ([], [5, 200, 131]):
        head.keep(keep)
        rows = model(torch.tensor([3, 200, 7, 9]), torch.arange(4), KVCache(args, 16),
                     readout=Readout(head=head)).logits
        rows = torch.cat([rows, rows[:1].clone(), rows[:1].clone()])
        top = 130 if keep else 10
        rows[-2, top] = rows[-2].max() + 5.0                          # the max among the prompt's strips
        rows[-1, 40] = rows[-1, 20] = rows[-1].max() + 1.0            # a tie: the lower id wins
        for row in rows:
            t, kept = head.pick(row)
            assert t == int(row.argmax())
            torch.testing.assert_close(torch.softmax(kept, -1).max(), torch.softmax(row, -1)[t])
        assert head.pick(rows[-2])[0] == top and head.pick(rows[-1])[0] == 20


def test_drafting_with_a_reduced_head_is_lossless():
    target, args = tiny_model("qwen2", backend="q4", vocab=256, seed=0)
    draft, _ = tiny_model("qwen2", backend="q4", vocab=256, seed=0)    # the model itself: high acceptance
    head = ReducedHead(draft, 32)
    dcache = KVCache(args, 200, extra=40)

    def factory(req):
        d = DraftModelDrafter(draft, dcache, req.sampling, head=head)
        d.reset()
        return d

    eng = Engine(target, KVCache(args, 200, extra=40), offered({"ngram": lambda r: NgramDrafter(r.ngram),
                                                                "draft": factory}), [], 200)
    prompt = [int(i) for i in torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(2))]
    outs = {}
    for spec in ("off", "draft"):
        *_, done = eng.generate(GenerationRequest(prompt_ids=prompt, max_new_tokens=40, spec=spec, k=4))
        assert isinstance(done, Finished)
        outs[spec] = done
    assert outs["draft"].ids == outs["off"].ids
    assert outs["draft"].stats.drafted > 0


def test_the_kept_ids_are_a_deterministic_leading_block_of_whole_strips():
    """The common ids are the first n_common rounded down to whole 16-id strips, the same on every build
    (no state, no corpus): the draft's proposals cannot depend on when or where it was loaded."""
    model, _ = tiny_model("qwen2", backend="q4", vocab=256)
    a, b = ReducedHead(model, 100), ReducedHead(model, 100)
    assert a.n_common == b.n_common == 96
    h = torch.randn(2, model.args.dim)
    assert torch.equal(a(h), b(h))
    assert ReducedHead.for_model(model, None) is None                  # --draft-vocab 0: the full head
    assert ReducedHead.for_model(model, 256) is None                   # no smaller than the vocabulary
    assert ReducedHead.for_model(model, 64).n_common == 64


def test_sampled_proposals_from_a_reduced_head_give_a_q_over_the_kept_ids_only():
    """Under sampling the draft's q [K, V] is a proper distribution that is zero past the kept ids, what
    the rejection rule needs to stay lossless (tests/decoding/test_verify_sampling.py, keep)."""
    from speczoo.request import SamplingParams

    model, args = tiny_model("qwen2", backend="q4", vocab=256, seed=1)
    head = ReducedHead(model, 32)
    d = DraftModelDrafter(model, KVCache(args, 64, extra=16), SamplingParams(temperature=1.5), torch.Generator(),
                          head=head)
    d.reset()
    prompt = [3, 200, 7, 9]
    d.prefill(prompt)                                                  # keeps strip 12 (ids 192..207)
    draft = d.propose(prompt, 6)
    kept = torch.zeros(256, dtype=torch.bool)
    kept[:32] = kept[192:208] = True
    assert draft.probs.shape == (len(draft.tokens), 256)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(len(draft.tokens)))
    assert float(draft.probs[:, ~kept].abs().sum()) == 0.0
    assert all(kept[t] for t in draft.tokens)


@pytest.mark.real
def test_the_real_draft_with_a_reduced_vocabulary_is_lossless():
    """qwen2.5-coder-0.5b drafting for itself through Runtime(draft_vocab=N): the drafter proposes from the
    reduced head it was given, and the output is plain greedy's, whatever N (a small N rejects more). No
    costs: a self-draft costs a whole step, which the controller would rightly refuse to pay."""
    import dataclasses

    from speczoo.bench.prompts import builtin_prompt
    from speczoo.runtime import Runtime, load

    loaded = load("qwen2.5-coder-0.5b")
    for n in (4096, None):
        rt = Runtime(loaded, draft=loaded, max_seq=1024, draft_vocab=n)
        spec = dataclasses.replace(rt.engine.drafters["draft"], cost=None)
        head = spec.factory(GenerationRequest(prompt_ids=[1], max_new_tokens=1)).head
        assert (head is None) if n is None else head.n_common == n
        eng = Engine(rt.engine.target, rt.engine.cache, [spec], rt.tokenizer.eos_ids, rt.max_seq)
        ids = rt.chat_ids([{"role": "user", "content": builtin_prompt("free_form").message}])
        outs = {}
        for mode in ("off", "draft"):
            *_, done = eng.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=32, spec=mode, k=4))
            outs[mode] = done
        assert outs["draft"].ids == outs["off"].ids
        assert outs["draft"].stats.drafted > 0


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", ["free_form", "code_edit"])
def test_the_zoo_pair_with_a_reduced_draft_vocabulary_equals_greedy(name):
    """The zoo's pair, qwen2.5-coder-0.5b drafting for qwen2.5-coder-1.5b, with the default reduced head:
    the output equals plain greedy's (slow: it needs the 1.5B, which CI's small pulls leave out). No costs,
    so every round drafts whatever the machine's speed (the controller's choices follow its timings)."""
    import dataclasses

    from speczoo.bench.prompts import builtin_prompt
    from speczoo.runtime import Runtime, load

    rt = Runtime(load("qwen2.5-coder-1.5b"), draft=load("qwen2.5-coder-0.5b"), max_seq=1024)
    spec = dataclasses.replace(rt.engine.drafters["draft"], cost=None)
    assert spec.factory(GenerationRequest(prompt_ids=[1], max_new_tokens=1)).head is not None
    eng = Engine(rt.engine.target, rt.engine.cache, [spec], rt.tokenizer.eos_ids, rt.max_seq)
    ids = rt.chat_ids([{"role": "user", "content": builtin_prompt(name).message}])
    outs = {}
    for mode in ("off", "draft"):
        *_, done = eng.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=64, spec=mode, k=8))
        outs[mode] = done
    assert outs["draft"].ids == outs["off"].ids
    assert outs["draft"].stats.accepted > 0
