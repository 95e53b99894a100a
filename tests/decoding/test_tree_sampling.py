"""Tree speculative sampling is lossless: the emitted tokens follow the target distribution.

The harness of test_verify_sampling.py (random oracle target p and drafter q over V tokens, N = 10,000
sequences of L = 3 tokens built from draft/verify rounds, chi-square against the exact target for the
joint of tokens 0, 1 and each position's marginal, cells with expected count < 5 pooled, pass when
every p-value > 1e-3), with token-tree drafts: a fixed branching per depth, the children of a node
drawn from q without replacement (probs: q with the earlier siblings removed), i.i.d. from q (probs: q),
or deterministically as q's top tokens (no probs, one-hot). Broken rules run through the same harness
must fail it, which shows the test can catch a lossy tree verifier.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from torch import Tensor

from speczoo.sampling import sample
from speczoo.decoding.verify.rejection import verify_tree_sampling
from speczoo.decoding.verify.tree import TreeLayout
from speczoo.decoding.types import Draft, Verdict
from lossless_stats import L, N_SEQ, P_THRESHOLD, Oracle, lossless_p_values, oracles


def draw_without(row: list[float], taken: list[int], rng: random.Random) -> tuple[int, list[float]]:
    """A token from `row` with `taken` removed (renormalized); returns (token, the row it came from)."""
    q = [0.0 if i in taken else x for i, x in enumerate(row)]
    total = sum(q)
    q = [x / total for x in q]
    u, acc = rng.random(), 0.0
    for i, x in enumerate(q):
        acc += x
        if u < acc:
            return i, q
    return max(i for i, x in enumerate(q) if x > 0), q


def make_tree(q: Oracle, prefix: tuple[int, ...], branching: tuple[int, ...], mode: str,
              rng: random.Random) -> tuple[Draft, list[tuple[int, ...]]]:
    """A tree draft after `prefix`; also each row's context (row 0: the prefix itself)."""
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[Tensor] = []
    contexts: list[tuple[int, ...]] = [prefix]
    frontier = [(-1, prefix)]
    for width in branching:
        nxt = []
        for parent, ctx in frontier:
            row = q(ctx).tolist()                                      # [V]
            nonzero = sum(x > 0 for x in row)
            taken: list[int] = []
            for _ in range(min(width, nonzero)):
                if mode == "without":
                    t, qj = draw_without(row, taken, rng)
                elif mode == "iid":
                    t, qj = q.draw(ctx, rng), row
                else:                                                  # one-hot: q's top tokens
                    t = max((i for i in range(q.v) if i not in taken), key=lambda i: row[i])
                    qj = None
                taken.append(t)
                tokens.append(t)
                parents.append(parent)
                rows.append(qj)
                contexts.append(ctx + (t,))
                nxt.append((len(tokens) - 1, ctx + (t,)))
        frontier = nxt
    probs = None if mode == "onehot" else torch.tensor(rows, dtype=torch.float64).reshape(-1, q.v)
    return Draft(tokens=tokens, probs=probs, parents=parents), contexts


def run_tree_sequences(p: Oracle, q: Oracle, branching: tuple[int, ...], mode: str, verify,
                       n: int = N_SEQ, seed: int = 0) -> tuple[list[tuple[int, ...]], float]:
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    out = []
    accepted = rounds = 0
    for _ in range(n):
        seq: list[int] = []
        while len(seq) < L:
            draft, contexts = make_tree(q, tuple(seq), branching, mode, rng)
            target = torch.stack([p(c) for c in contexts])                 # [N+1, V]
            verdict = verify(draft, TreeLayout.from_parents(draft.parents), target, gen)
            seq.extend(verdict.emitted(draft))
            accepted += verdict.accepted
            rounds += 1
        out.append(tuple(seq[:L]))
    return out, accepted / rounds


CONFIGS = [  # (V, branching per depth, how children are drawn, seed)
    pytest.param(8, (3, 2, 1), "without", 11, id="V8-3x2x1-without-replacement"),
    pytest.param(12, (2, 2), "iid", 12, id="V12-2x2-iid"),
    pytest.param(12, (3, 1), "onehot", 13, id="V12-3x1-onehot"),
    pytest.param(20, (4, 2), "without", 14, id="V20-4x2-without-replacement"),
]


@pytest.mark.parametrize("v,branching,mode,seed", CONFIGS)
def test_tree_emits_the_target_distribution(v, branching, mode, seed):
    p, q = oracles(v, seed)
    seqs, acc = run_tree_sequences(p, q, branching, mode, verify_tree_sampling, seed=seed)
    pvals = lossless_p_values(seqs, p)
    assert min(pvals.values()) > P_THRESHOLD, pvals
    assert acc > 0.5            # the trees were really exercised: more than half a token per round


def no_residual_between_siblings(draft: Draft, layout: TreeLayout, target: Tensor,
                                 gen: torch.Generator) -> Verdict:
    """Every sibling tested against the row's p (no residual carried), correction from p: lossy."""
    path, row = [], 0
    while True:
        for c in layout.children[row]:
            tok = draft.tokens[c]
            q_tok = 1.0 if draft.probs is None else float(draft.probs[c, tok])
            if float(torch.rand((), generator=gen, dtype=torch.float64)) * q_tok < float(target[row, tok]):
                path.append(c)
                row = c + 1
                break
        else:
            return Verdict(len(path), int(sample(target[row][None].double(), gen)), path)


def plain_q_for_later_siblings(draft: Draft, layout: TreeLayout, target: Tensor,
                               gen: torch.Generator) -> Verdict:
    """The right rule fed the wrong q: children drawn without replacement but judged against the
    parent's plain q (the drafter misreports what it drew from)."""
    probs = draft.probs.clone()
    for kids in layout.children:
        for c in kids[1:]:
            probs[c] = probs[kids[0]]
    return verify_tree_sampling(Draft(draft.tokens, probs, draft.parents), layout, target, gen)


@pytest.mark.parametrize("broken", [no_residual_between_siblings, plain_q_for_later_siblings])
def test_broken_tree_rules_fail_the_same_test(broken):
    p, q = oracles(8, 11)
    seqs, _ = run_tree_sequences(p, q, (3, 2, 1), "without", broken, seed=11)
    pvals = lossless_p_values(seqs, p)
    assert min(pvals.values()) < P_THRESHOLD, f"{broken.__name__} was not caught: {pvals}"


def test_chain_tree_matches_chain_rule_statistics():
    """A chain given as a tree follows the target too (the tree rule reduces to the chain rule)."""
    p, q = oracles(12, 2)
    seqs, _ = run_tree_sequences(p, q, (1, 1, 1), "iid", verify_tree_sampling, seed=2)
    assert min(lossless_p_values(seqs, p).values()) > P_THRESHOLD


def test_one_hot_siblings_each_accept_with_their_target_probability():
    # p = (0.5, 0.3, 0.2); siblings 0 then 1, deterministic: P(accept 0) = .5, P(accept 1) = .3,
    # otherwise the residual leaves only token 2.
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    draft = Draft(tokens=[0, 1], parents=[-1, -1])
    lay = TreeLayout.from_parents(draft.parents)
    got = Counter()
    for _ in range(6000):
        v = verify_tree_sampling(draft, lay, p, gen)
        got[(tuple(v.path), v.next_token)] += 1
    assert set(got) == {((0,), 0), ((1,), 1), ((), 2)}
    assert abs(got[((0,), 0)] / 6000 - 0.5) < 0.03 and abs(got[((1,), 1)] / 6000 - 0.3) < 0.03


def test_errors_are_clear():
    gen = torch.Generator().manual_seed(0)
    draft = Draft(tokens=[1, 2], parents=[-1, -1])
    lay = TreeLayout.from_parents(draft.parents)
    with pytest.raises(ValueError, match=r"N\+1=3"):
        verify_tree_sampling(draft, lay, torch.full((2, 4), 0.25), gen)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        verify_tree_sampling(Draft(tokens=[1, 7], parents=[-1, -1]), lay, torch.full((3, 4), 0.25), gen)
    with pytest.raises(ValueError, match="q = 0"):
        bad = Draft(tokens=[1, 2], parents=[-1, -1], probs=torch.tensor([[1.0, 0, 0, 0], [0, 0, 1.0, 0]]))
        verify_tree_sampling(bad, lay, torch.full((3, 4), 0.25), gen)
    with pytest.raises(ValueError, match="not a distribution"):
        verify_tree_sampling(Draft(tokens=[2], parents=[-1]), TreeLayout.from_parents([-1]),
                             torch.tensor([[0.0, 0.0, 1.0, 0.0], [float("nan"), 0.5, 0.5, 0.0]]), gen)
