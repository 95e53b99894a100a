"""Token trees through the engine: one tree forward per round, compaction, greedy losslessness.

Tiny random models (every architecture; the gemma ones with their sliding windows) and oracles. A scripted
drafter proposes trees that hide the target's true continuation among wrong branches, so that the
accepted path is often not the first branch and the compaction really moves K/V rows.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.decoding.round import Finished, RoundPlan
from speczoo.sampling import probs as sampling_probs
from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.drafters.registry import NGRAM_TREE
from speczoo.decoding.engine import MAX_K, Engine
from speczoo.decoding.pricing.cost import Costs
from reference import (HashOracle, NoisyOracle, OracleModel, TokenCache,
                                    reference_greedy)
from speczoo.decoding.verify.tree import TreeLayout
from speczoo.decoding.types import Draft
from lossless_stats import PARAMS, PROMPT, V, chi_square_p, exact_joint
from tiny import ARCHS, tiny_model
from hand_tree import PARENT, ScriptedTree, tree_inputs
from offered import offered
from oracle_engines import random_case

INVARIANT = "fp32-rows"


def model_engine(arch: str, backend: str, drafters: dict, max_seq: int = 96, vocab: int = 32,
                 kv_dtype: torch.dtype = torch.float32):
    model, args = tiny_model(arch, backend=backend, vocab=vocab)
    eng = Engine(model, KVCache(args, max_seq, extra=MAX_K + 1, dtype=kv_dtype), offered(drafters), eos_ids=[],
                 max_seq=max_seq)
    return eng, model, args


def run(eng, **kw) -> Finished:
    *events, done = eng.generate(GenerationRequest(**kw))
    assert isinstance(done, Finished)
    assert sum((e.ids for e in events), []) == done.ids
    return done


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend,kv_dtype", [("fp32", torch.float32), (INVARIANT, torch.float32),
                                              ("q4", torch.float32),      # q4: the compiled kernels and blocks
                                              (INVARIANT, torch.float16), ("q4", torch.float16)])   # a 16-bit KV cache
def test_scripted_trees_are_lossless_on_tiny_models(arch, backend, kv_dtype):
    eng, _, _ = model_engine(arch, backend, {}, kv_dtype=kv_dtype)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = run(eng, prompt_ids=prompt, max_new_tokens=40)
    truth = prompt + plain.ids
    drafter = ScriptedTree(truth, vocab=32, seed=1)
    eng = eng.offer(*offered({"tree": lambda req: drafter}))
    spec = run(eng, prompt_ids=prompt, max_new_tokens=40, spec="tree", k=12)
    assert spec.ids == plain.ids
    assert spec.stats.accepted > 10 and spec.stats.rounds < 35
    assert any(p and p != list(range(len(p))) for p in drafter.paths), "no off-first-branch path accepted"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend,kv_dtype", [(INVARIANT, torch.float32), (INVARIANT, torch.float16),
                                              ("q4", torch.float16)])
def test_cache_after_tree_rounds_equals_a_fresh_prefill(arch, backend, kv_dtype):
    """Compaction == recompute: after every tree round the target's cache holds exactly the K/V a fresh
    prefill of the committed sequence computes (bitwise, on the batch-invariant backends; fp32 or fp16)."""
    eng, model, args = model_engine(arch, backend, {}, kv_dtype=kv_dtype)
    prompt = [7, 7, 2, 9, 11, 3, 5, 8, 13]
    truth = prompt + run(eng, prompt_ids=prompt, max_new_tokens=30).ids
    eng = eng.offer(*offered({"tree": lambda req: ScriptedTree(truth, vocab=32, seed=2)}))
    gen = eng.generate(GenerationRequest(prompt_ids=prompt, max_new_tokens=30, spec="tree", k=10))
    committed = list(prompt)
    checked = 0
    for ev in gen:
        if isinstance(ev, Finished):
            break
        committed += ev.ids
        n = eng.cache.length          # every emitted id (the next round's a0 is not emitted yet)
        assert n == len(committed) or (n == len(committed) - 1 and ev.drafted == 0)
        fresh = KVCache(args, 128, dtype=kv_dtype)
        model(torch.tensor(committed[:n]), torch.arange(n), fresh)
        for layer in range(len(args.kv_layers)):
            assert torch.equal(eng.cache.k[layer][:, :n], fresh.k[layer][:, :n])
            assert torch.equal(eng.cache.v[layer][:, :n], fresh.v[layer][:, :n])
        if args.conv_layers:                    # a hybrid's convolution state too
            assert torch.equal(eng.cache.conv.state(n), fresh.conv.state(n))
        checked += 1
    assert checked > 5


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_path_equals_chain_path_when_the_tree_is_a_chain(arch):
    """A tree verify of a chain gives the chain verify's verdict and cache, bit for bit."""
    eng, model, args = model_engine(arch, INVARIANT, {})
    prompt = torch.tensor([5, 6, 7, 8, 9, 10, 11])
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        eng.cache.reset()
        model(prompt, torch.arange(7), eng.cache)
        logits = model(torch.tensor([3]), torch.tensor([7]), eng.cache).logits     # pending token's row
        eng.cache.truncate(7)
        truth = [int(logits.argmax())]
        tokens = truth + torch.randint(0, 32, (5,), generator=g).tolist()
        draft = Draft(tokens=tokens, parents=[-1, 0, 1, 2, 3, 4])
        g = eng.open(GenerationRequest(prompt_ids=prompt.tolist(), max_new_tokens=1))
        g.pending = 3
        verdict, judged = eng._verify(g, RoundPlan("none", draft, chain=False))
        tree_cache = [t[:, :eng.cache.length].clone() for t in eng.cache.k]
        eng.cache.truncate(7)
        chain_logits = eng._forward([3] + tokens)
        from speczoo.decoding.verify.greedy import verify_greedy
        chain = verify_greedy(Draft(tokens=tokens), chain_logits.argmax(-1).tolist())
        eng.cache.truncate(7 + 1 + chain.accepted)
        assert (verdict.accepted, verdict.path, verdict.next_token) == \
            (chain.accepted, chain.path, chain.next_token)
        assert judged == chain.accepted + (chain.accepted < len(tokens))
        assert all(torch.equal(a, b[:, :eng.cache.length]) for a, b in zip(tree_cache, eng.cache.k))


def test_tree_layout_matches_the_model_tests_hand_made_tree():
    _, positions, mask = tree_inputs(9)
    # the model tests' tree (hand_tree.py) has no a0 row: its nodes are rows 0..; ours put a0 first at 9.
    lay = TreeLayout.from_parents([p - 1 for p in PARENT[1:]])   # their node 0 is our a0
    assert torch.equal(lay.mask, mask)
    assert torch.equal(lay.positions(9), positions)


@pytest.mark.parametrize("arch", ARCHS)
def test_ngram_tree_is_lossless_on_tiny_models(arch):
    drafters = {"ngram-tree": lambda req: NgramTreeDrafter(max_order=req.ngram)}
    eng, _, _ = model_engine(arch, INVARIANT, drafters, vocab=16)   # a small vocab repeats itself
    prompt = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2]
    plain = run(eng, prompt_ids=prompt, max_new_tokens=48)
    tree = run(eng, prompt_ids=prompt, max_new_tokens=48, spec="ngram-tree", k=16)
    assert tree.ids == plain.ids
    assert tree.stats.accepted > 0


def oracle_engine(oracle, max_seq=256, eos=(), costs: Costs | None = None):
    model = OracleModel(oracle)
    drafters = {"ngram": lambda req: NgramDrafter(max_order=req.ngram),
                "ngram-tree": NGRAM_TREE.factory}
    eng = Engine(model, TokenCache(max_seq + 80), offered(drafters), eos_ids=list(eos), max_seq=max_seq,
                 costs=costs)
    return eng, model


def test_ngram_tree_equals_greedy_on_1000_random_oracle_cases():
    """The property test of test_spec_property.py with the tree drafter."""
    rng = random.Random(4321)
    accepted = {"ngram": 0, "ngram-tree": 0}
    rounds = {"ngram": 0, "ngram-tree": 0}
    for case in range(1000):
        oracle, prompt, n, k, order, eos = random_case(rng)
        k = rng.choice([k, 16])
        expected = reference_greedy(oracle, prompt, n, eos)
        for spec in ("ngram", "ngram-tree"):
            eng, model = oracle_engine(oracle, eos=eos)
            done = run(eng, prompt_ids=prompt, max_new_tokens=n, spec=spec, k=k, ngram=order)
            assert done.ids == expected, f"case {case} {spec}: k={k} order={order} prompt={prompt}"
            assert model.forwards == done.stats.rounds + 1
            accepted[spec] += done.stats.accepted
            rounds[spec] += done.stats.rounds
    assert accepted["ngram-tree"] > 3000
    # more candidates per round: the tree accepts more per round than the chain on the same cases
    assert accepted["ngram-tree"] / rounds["ngram-tree"] > accepted["ngram"] / rounds["ngram"]


# c_v(S) of the 1.5B on a Zen 4 (docs/results.md): every extra verify row costs something
ZEN4_15B = {1: 1.0, 2: 1.15, 3: 1.22, 5: 1.56, 9: 2.69, 17: 4.66}


@pytest.mark.parametrize("cv", [1.0, ZEN4_15B])
def test_auto_with_prompt_lookup_trees_equals_greedy_on_random_oracle_cases(cv):
    """`auto` over the chain and the tree of prompt lookup, each round priced by the controller (the tree
    by its own trees' a(N)): the same ids as plain greedy, one target forward per round, and both chosen."""
    rng = random.Random(2468)
    chosen = Counter()
    costs = Costs(cv=cv, draft_cost={"ngram": 0.0, "ngram-tree": 0.0})
    for case in range(300):
        oracle, prompt, n, k, order, eos = random_case(rng)
        expected = reference_greedy(oracle, prompt, n, eos)
        eng, model = oracle_engine(oracle, eos=eos, costs=costs)
        *rounds, done = eng.generate(GenerationRequest(prompt_ids=prompt, max_new_tokens=n, spec="auto", k=k,
                                                       ngram=order))
        assert done.ids == expected, f"case {case}: k={k} order={order} prompt={prompt}"
        assert model.forwards == done.stats.rounds + 1
        chosen.update(r.drafter for r in rounds if r.drafted)
    assert chosen["ngram-tree"] > 50 and chosen["ngram"] > 50, chosen


class SampledTree(Drafter):
    """Samples a 2-then-1 tree from a noisy oracle's processed distribution: two children of a0 drawn
    without replacement (the second one's q excludes the first), one child below each."""

    name = "sampled-tree"

    def __init__(self, oracle, params: SamplingParams, gen: torch.Generator):
        self.oracle, self.params, self.gen = oracle, params, gen

    def reset(self) -> None:
        pass

    def _q(self, ctx: list[int], without: list[int]) -> torch.Tensor:
        q = sampling_probs(self.oracle.logits(ctx)[None], self.params)[0].clone()    # [V]
        q[without] = 0.0
        return q / q.sum()

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        tokens, parents, rows = [], [], []
        for _ in range(2):
            q = self._q(context, tokens)
            tokens.append(int(torch.multinomial(q, 1, generator=self.gen)))
            parents.append(-1)
            rows.append(q)
        for i in range(len(tokens)):
            q = self._q(context + [tokens[i]], [])
            tokens.append(int(torch.multinomial(q, 1, generator=self.gen)))
            parents.append(i)
            rows.append(q)
        n = min(k, len(tokens))
        return Draft(tokens=tokens[:n], parents=parents[:n], probs=torch.stack(rows[:n]), drafter=self.name)

    def commit(self, accepted: int) -> None:
        pass


@pytest.mark.parametrize("spec", ["sampled-tree", "ngram-tree"])
def test_engine_tree_sampling_matches_target_distribution(spec):
    """As test_engine_sampling.py: the joint of the first three emitted tokens, 8,000 runs, chi-square."""
    target = HashOracle(V, seed=11, order=2)
    noisy = NoisyOracle(target, miss=0.4, seed=3)
    drafters = {"sampled-tree": lambda req: SampledTree(noisy, req.sampling,
                                                        torch.Generator().manual_seed(req.sampling.seed + 7)),
                "ngram-tree": lambda req: NgramTreeDrafter(2)}
    eng = Engine(OracleModel(target), TokenCache(64), offered(drafters), eos_ids=[], max_seq=32)
    n, runs = 3, 8_000
    counts, accepted = Counter(), 0
    for seed in range(runs):
        req = GenerationRequest(prompt_ids=PROMPT, max_new_tokens=n, spec=spec, k=4,
                                sampling=SamplingParams(PARAMS.temperature, PARAMS.top_k, seed=seed))
        *_, done = eng.generate(req)
        assert len(done.ids) == n
        counts[tuple(done.ids)] += 1
        accepted += done.stats.accepted
    p = chi_square_p(counts, exact_joint(target, n), runs)
    assert p > 1e-3, f"{spec}: emitted joint differs from the target's (chi-square p={p:.2e})"
    assert accepted > runs // 20
