"""The EAGLE drafter through the engine, on a tiny random target and a head trained on it in seconds:
greedy chains and trees are lossless, the head cache holds exactly the committed rows (== a fresh
recompute), trees follow the head's ranking, and sampled chains carry a proper q."""

import math

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.decoding.round import Finished
from speczoo.decoding.drafters.eagle import EagleDrafter, TreeShape, make_eagle_drafter
from speczoo.decoding.engine import MAX_K, Engine
from speczoo.models.forward import Readout
from tiny_eagle import INVARIANT, PROMPT, VOCAB
from offered import offered


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def engine(model, args, head, tree=None, max_seq=128) -> Engine:
    return Engine(model, KVCache(args, max_seq, extra=MAX_K + 1),
                  offered({"eagle": make_eagle_drafter(head, max_seq, tree)}), eos_ids=[], max_seq=max_seq)


def run(eng, **kw) -> Finished:
    *events, done = eng.generate(GenerationRequest(**kw))
    assert sum((e.ids for e in events), []) == done.ids
    return done


@pytest.mark.parametrize("tree", [None, TreeShape(depth=4, branch=3)], ids=["chain", "tree"])
def test_eagle_is_lossless_and_accepts(trained, tree):
    model, args, head = trained
    eng = engine(model, args, head, tree)
    plain = run(eng, prompt_ids=PROMPT, max_new_tokens=60)
    spec = run(eng, prompt_ids=PROMPT, max_new_tokens=60, spec="eagle", k=6 if tree is None else 12)
    assert spec.ids == plain.ids
    assert spec.stats.accepted_per_round > 1.0, spec.stats        # chain ~1.9, tree ~2.3 here


def test_head_cache_holds_the_committed_rows(trained):
    """After a generation the head cache equals a fresh head cache fed every committed row at once
    (rollback == recompute); drafting never leaves rows behind."""
    model, args, head = trained
    made: list[EagleDrafter] = []
    factory = make_eagle_drafter(head, 128)
    eng = engine(model, args, head)
    eng = eng.offer(*offered({"eagle": lambda req: made.append(factory(req)) or made[-1]}))
    done = run(eng, prompt_ids=PROMPT, max_new_tokens=30, spec="eagle", k=5)
    d = made[-1]
    committed = PROMPT + done.ids
    n = d.cache.length
    assert n + sum(p.shape[0] for p in d.pending) == d.observed      # the rest awaits the next proposal
    assert n >= len(committed) - 8
    out = model(torch.tensor(committed[:n]), torch.arange(n), KVCache(args, 128),
                readout=Readout(hidden_layers=head.cfg.target_layers))
    fresh = KVCache(head.kv_args(), 128)
    head.step(torch.tensor(committed[1:n + 1]), head.fuse(torch.cat(out.hidden, -1)), torch.arange(1, n + 1), fresh)
    torch.testing.assert_close(d.cache.k[0][:, :n], fresh.k[0][:, :n], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(d.cache.v[0][:, :n], fresh.v[0][:, :n], atol=1e-4, rtol=1e-4)


def feed(head, model, args, context: list[int], tree=None) -> EagleDrafter:
    """A drafter that has observed the target's features of every position but the last of `context`."""
    d = EagleDrafter(head, KVCache(head.kv_args(), 128), tree=tree)
    out = model(torch.tensor(context[:-1]), torch.arange(len(context) - 1), KVCache(args, 128),
                readout=Readout(hidden_layers=head.cfg.target_layers))
    d.observe(out.hidden)
    return d


def test_propose_without_the_features_is_an_error(trained):
    model, args, head = trained
    d = feed(head, model, args, PROMPT)
    with pytest.raises(RuntimeError, match="observe"):
        d.propose(PROMPT + [3], 4)


def test_one_branch_tree_is_the_chain(trained):
    model, args, head = trained
    ctx = PROMPT + [3]
    chain = feed(head, model, args, ctx).propose(ctx, 5)
    tree = feed(head, model, args, ctx, TreeShape(depth=5, branch=1)).propose(ctx, 5)
    assert tree.tokens == chain.tokens and tree.parents == [-1, 0, 1, 2, 3]


def test_tree_nodes_are_the_heads_top_children(trained):
    """Every node is among the top-`branch` tokens the head predicts after its parent's path (computed
    again as a plain chain), and parents come before children within the budget."""
    model, args, head = trained
    ctx = PROMPT + [3]
    shape = TreeShape(depth=4, branch=3)
    d = feed(head, model, args, ctx, shape)
    draft = d.propose(ctx, 16)
    assert draft.k == 16 and all(-1 <= p < i for i, p in enumerate(draft.parents))
    assert d.cache.length == len(ctx) - 1
    for i in range(draft.k):
        path, node = [], draft.parents[i]
        while node >= 0:
            path.append(draft.tokens[node])
            node = draft.parents[node]
        path.reverse()
        c = feed(head, model, args, ctx)
        c._catch_up(ctx)
        hidden, logits = c.last
        for j, t in enumerate(path):
            o = head.step(torch.tensor([t]), hidden, torch.tensor([len(ctx) + j]), c.cache)
            hidden, logits = o.hidden, o.logits
        top = head.draft_to_target[torch.topk(logits[0], shape.branch).indices].tolist()
        assert draft.tokens[i] in top, (i, path)


def test_sampled_chain_carries_its_distribution(trained):
    model, args, head = trained
    ctx = PROMPT + [3]
    d = feed(head, model, args, ctx)
    d.params = SamplingParams(temperature=0.8, top_p=0.95)
    d.generator = torch.Generator().manual_seed(0)
    draft = d.propose(ctx, 4)
    assert draft.probs.shape == (4, VOCAB)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(4))
    assert all(float(draft.probs[i, t]) > 0 for i, t in enumerate(draft.tokens))
    assert float(draft.probs[:, ~head.t2d].sum()) == 0.0
    eng = engine(model, args, head)
    done = run(eng, prompt_ids=PROMPT, max_new_tokens=20, spec="eagle", k=4,
               sampling=SamplingParams(temperature=0.8, seed=1))
    assert len(done.ids) == 20


def test_replay_counts_what_greedy_verification_accepts(trained):
    from speczoo.decoding.eagle_replay import greedy_with_features, replay
    from speczoo.decoding.round import RoundPlan, verify_recorded
    from speczoo.decoding.types import Draft
    a0 = [1]                                                                    # out[0]: the round's a0
    assert verify_recorded(RoundPlan("eagle", Draft([4, 5, 6])), a0 + [4, 5, 7], 0)[0].accepted == 2
    tree = RoundPlan("eagle", Draft([9, 4, 5, 6, 8], parents=[-1, -1, 1, 2, 2]), chain=False)
    assert verify_recorded(tree, a0 + [4, 5, 8, 1], 0)[0].accepted == 3         # 4 -> 5 -> 8, off the first branch
    model, args, head = trained
    ids, hidden = greedy_with_features(model, PROMPT, 40, head.cfg.target_layers)
    eng = engine(model, args, head)
    assert ids[len(PROMPT):] == run(eng, prompt_ids=PROMPT, max_new_tokens=40).ids
    chain = replay(head, ids, hidden, len(PROMPT), 6)
    assert chain.tokens in (39, 40) and chain.accepted_per_round > 1.0
    tree = replay(head, ids, hidden, len(PROMPT), 12, TreeShape(depth=4, branch=3))
    assert tree.tokens in (39, 40) and tree.accepted_per_round >= chain.accepted_per_round * 0.9


class StubDecoder:
    def feed(self, ids) -> str:
        return "".join(f"<{i}>" for i in ids)

    def flush(self) -> str:
        return ""


class StubTokenizer:
    eos_ids: list[int] = []

    def decode(self, ids) -> str:
        return "".join(f"<{i}>" for i in ids)

    def incremental_decoder(self) -> StubDecoder:
        return StubDecoder()


def test_runtime_offers_installed_heads(trained, tmp_path, monkeypatch):
    """A runtime over a target with an installed head offers eagle and eagle-tree (auto too), all
    lossless; a head the runtime did not load fails before any event, an unknown one at load."""
    from speczoo.errors import UnknownModelError
    from speczoo.runtime import LoadedModel, Runtime
    from speczoo.zoo.heads import install_head
    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path / "home"))
    from speczoo.decoding.eagle.io import save_head
    model, args, head = trained
    install_head(save_head(head, tmp_path / "head"), "tiny-eagle")
    loaded = LoadedModel(name="tiny", path=tmp_path, args=args, model=model, tokenizer=StubTokenizer(),
                         backend=INVARIANT)
    rt = Runtime(loaded, max_seq=128)
    assert {"eagle", "eagle-tree"} <= set(rt.spec_modes)
    # EAGLE's tree only by name (its descriptor); prompt lookup's is priced by its own trees
    assert rt.engine._drafter_names("auto") == ["ngram", "ngram-tree", "suffix", "eagle"]
    assert rt.engine.costs.draft_cost["eagle"] > 0

    def ids(spec, k=6):
        *_, done = rt.generate(GenerationRequest(prompt_ids=PROMPT, max_new_tokens=30, spec=spec, k=k))
        return done.ids, done.stats

    plain, _ = ids("off")
    for spec in ("eagle", "eagle-tree", "eagle:tiny-eagle", "eagle-tree:tiny-eagle", "auto"):
        got, stats = ids(spec, k=12 if "tree" in spec else 6)
        assert got == plain, spec
    with pytest.raises(ValueError, match="drafts with tiny-eagle"):      # the head is the one loaded, never another
        rt.generate(GenerationRequest(prompt_ids=PROMPT, max_new_tokens=5, spec="eagle:nope-eagle"))
    assert rt.eagle.names == ("tiny-eagle",) and rt.eagle.step > 0       # resolved and timed once, at load
    with pytest.raises(UnknownModelError):                                # a head named at load must exist
        Runtime(loaded, max_seq=128, eagle_head="nope-eagle")


def test_head_step_is_priced_against_the_target_step_timed_with_it(trained):
    """head_step_cost times the head and the target in turn, so what slows the target down right now
    (here: 20 ms of sleep in its forward, as a busy machine would) lowers the head's price in target
    steps instead of being read as the head's own cost."""
    import time

    from speczoo.eagle_drafters import head_step_cost
    model, args, head = trained
    quick = head_step_cost(head, model, args, rounds=2, repeats=2)
    assert 0 < quick < math.inf

    def slow(*a, **kw):
        time.sleep(0.02)
        return model(*a, **kw)
    slowed = head_step_cost(head, slow, args, rounds=2, repeats=2)
    assert slowed < quick and slowed < 0.2


def test_chain_stops_on_its_confidence(trained):
    """Floors stop the chain once the product of the head's probabilities falls below them; the tokens
    drafted are the unstopped chain's prefix, the cache is left with the committed rows only, and the
    engine with floors (the controller's, from its costs) stays lossless."""
    model, args, head = trained
    ctx = PROMPT + [3]
    full = feed(head, model, args, ctx).propose(ctx, 5)
    assert len(full.tokens) == 5
    d = feed(head, model, args, ctx)
    assert d.stops_on_confidence and not EagleDrafter(head, KVCache(head.kv_args(), 8), tree=TreeShape()
                                                      ).stops_on_confidence
    stopped = d.propose(ctx, 5, floors=(1.0,) * 4)          # no product of probabilities reaches 1.0
    assert stopped.tokens == full.tokens[:1] and d.cache.length == len(ctx) - 1
    assert feed(head, model, args, ctx).propose(ctx, 5, floors=(0.0,) * 4).tokens == full.tokens
    from speczoo.decoding.pricing.cost import Costs
    eng = engine(model, args, head)
    plain = run(eng, prompt_ids=PROMPT, max_new_tokens=40)
    eng.costs = Costs(cv={1: 1.0, 2: 1.05, 9: 1.6}, draft_cost={"eagle": 0.05})
    spec = run(eng, prompt_ids=PROMPT, max_new_tokens=40, spec="eagle", k=6)
    assert spec.ids == plain.ids and spec.stats.rounds < 40


def test_prompt_rows_are_fed_in_prefill_and_lag_counts_the_rest(trained):
    """The engine hands over the prompt's features before the drafters' prefill, so the head ingests the
    prompt there (not in the first round's timed proposal); rows it has not fed since count as its lag,
    which the controller charges as catch-up."""
    model, args, head = trained
    made: list[EagleDrafter] = []
    factory = make_eagle_drafter(head, 128)
    seen: list[tuple[int, int]] = []

    def spy(req):
        d = factory(req)
        made.append(d)
        prefill = d.prefill

        def logged(prompt):
            prefill(prompt)
            seen.append((d.cache.length, d.observed))
        d.prefill = logged
        return d
    eng = engine(model, args, head)
    eng = eng.offer(*offered({"eagle": spy}))
    plain = run(eng, prompt_ids=PROMPT, max_new_tokens=20)
    assert run(eng, prompt_ids=PROMPT, max_new_tokens=20, spec="eagle", k=4).ids == plain.ids
    assert seen == [(len(PROMPT) - 1, len(PROMPT))]           # every prompt row but the last one, in prefill
    d = feed(head, model, args, PROMPT + [3])                    # features of the prompt only, none fed yet
    ctx = PROMPT + [3]
    assert d.lag(ctx) == len(ctx) - 2 and d.cache.length == 0
    d.prefill(PROMPT)
    assert d.cache.length == len(PROMPT) - 1 and d.lag(ctx) == 0
    fresh = feed(head, model, args, ctx)
    assert d.propose(ctx, 4).tokens == fresh.propose(ctx, 4).tokens   # fed in two parts == fed at once
