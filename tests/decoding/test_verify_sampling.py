"""Speculative-sampling verification is lossless: the emitted tokens follow the target distribution.

The statistical test: small random oracle "models" (the target p and the drafter q depend on the
position and the last two tokens), N = 10,000 independent sequences per configuration, each built
from draft/verify rounds until it has L = 3 tokens. The empirical distribution of (token 0, token 1)
and of each position's token is compared with the exact target distribution by a chi-square test
(cells with expected count < 5 pooled), and must have p > 1e-3. Seeds are fixed, so the test is
deterministic. The same harness run with deliberately broken rules must give p < 1e-3 somewhere:
that proves the test has the power to catch a lossy verifier.
"""

from __future__ import annotations

import math
import itertools
import random
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from speczoo.request import SamplingParams
from speczoo.sampling import probs as sampling_probs
from speczoo.decoding.types import Draft, Verdict
from speczoo.decoding.verify.greedy import verify_greedy
from speczoo.decoding.verify.rejection import verify_sampling
from lossless_stats import L, N_SEQ, P_THRESHOLD, Oracle, exact_target, lossless_p_values, oracles


VerifyFn = Callable[[Draft, Tensor, torch.Generator], Verdict]


def run_sequences(p: Oracle, q: Oracle, k: int, verify: VerifyFn, one_hot: bool,
                  n: int = N_SEQ, seed: int = 0) -> list[tuple[int, ...]]:
    """n sequences of L tokens, each produced by speculative rounds of K draft tokens."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        seq: list[int] = []
        while len(seq) < L:
            tokens: list[int] = []
            rows: list[Tensor] = []
            for _ in range(k):
                prefix = tuple(seq + tokens)
                if one_hot:      # an n-gram-like drafter: a deterministic guess, no probs
                    tokens.append(int(q(prefix).argmax()))
                else:
                    tokens.append(q.draw(prefix, rng))
                    rows.append(q(prefix))                                 # [V]
            draft = Draft(tokens=tokens, probs=None if one_hot else
                          (torch.stack(rows) if rows else torch.zeros(0, p.v)))
            target = torch.stack([p(tuple(seq + tokens[:i])) for i in range(k + 1)])  # [K+1, V]
            seq.extend(verify(draft, target, gen).emitted(draft))
        out.append(tuple(seq[:L]))
    return out


CONFIGS = [  # (V, K, draft has probs?, seed)
    pytest.param(8, 1, True, 1, id="V8-K1-probs"),
    pytest.param(12, 3, True, 2, id="V12-K3-probs"),
    pytest.param(20, 5, True, 3, id="V20-K5-probs"),
    pytest.param(12, 3, False, 4, id="V12-K3-onehot"),
]


@pytest.mark.parametrize("v,k,with_probs,seed", CONFIGS)
def test_emitted_tokens_follow_target_distribution(v, k, with_probs, seed):
    p, q = oracles(v, seed)
    seqs = run_sequences(p, q, k, verify_sampling, one_hot=not with_probs, seed=seed)
    pvals = lossless_p_values(seqs, p)
    assert min(pvals.values()) > P_THRESHOLD, pvals


def accept_always(draft: Draft, target: Tensor, gen: torch.Generator) -> Verdict:
    return Verdict(accepted=draft.k, next_token=int(torch.multinomial(target[draft.k], 1, generator=gen)),
                   path=list(range(draft.k)))


def correction_from_p(draft: Draft, target: Tensor, gen: torch.Generator) -> Verdict:
    """The right acceptance test, but the correction drawn from p instead of the residual."""
    for i, tok in enumerate(draft.tokens):
        q_tok = 1.0 if draft.probs is None else float(draft.probs[i, tok])
        if float(torch.rand((), generator=gen, dtype=torch.float64)) * q_tok >= float(target[i, tok]):
            return Verdict(accepted=i, next_token=int(torch.multinomial(target[i], 1, generator=gen)),
                           path=list(range(i)))
    return Verdict(accepted=draft.k, next_token=int(torch.multinomial(target[draft.k], 1, generator=gen)),
                   path=list(range(draft.k)))


def accept_prob_p(draft: Draft, target: Tensor, gen: torch.Generator) -> Verdict:
    """Accept with probability p(d) (ignoring q), correction from the residual: a plausible slip."""
    for i, tok in enumerate(draft.tokens):
        if float(torch.rand((), generator=gen, dtype=torch.float64)) >= float(target[i, tok]):
            q = draft.probs[i].double()
            res = torch.clamp(target[i].double() - q, min=0)
            res = res if float(res.sum()) > 0 else target[i]
            return Verdict(accepted=i, next_token=int(torch.multinomial(res, 1, generator=gen)),
                           path=list(range(i)))
    return Verdict(accepted=draft.k, next_token=int(torch.multinomial(target[draft.k], 1, generator=gen)),
                   path=list(range(draft.k)))


@pytest.mark.parametrize("v,k,keep,seed", [pytest.param(12, 3, 6, 5, id="V12-K3-keep6"),
                                            pytest.param(20, 5, 4, 6, id="V20-K5-keep4")])
def test_a_reduced_draft_vocabulary_keeps_sampling_lossless(v, k, keep, seed):
    """A draft proposing from its first `keep` ids (q = 0 past them, a reduced draft head): the target's
    other ids come only from the residual, and the emitted tokens still follow the target."""
    p, q = oracles(v, seed, keep=keep)
    assert all(float(q((t,))[keep:].sum()) == 0.0 for t in range(v))
    seqs = run_sequences(p, q, k, verify_sampling, one_hot=False, seed=seed)
    assert any(t >= keep for s in seqs for t in s)          # ids the draft cannot propose are emitted
    pvals = lossless_p_values(seqs, p)
    assert min(pvals.values()) > P_THRESHOLD, pvals


@pytest.mark.parametrize("broken", [accept_always, correction_from_p, accept_prob_p])
def test_broken_rules_fail_the_same_test(broken):
    v, k, seed = 12, 3, 2
    p, q = oracles(v, seed)
    seqs = run_sequences(p, q, k, broken, one_hot=False, seed=seed)
    pvals = lossless_p_values(seqs, p)
    assert min(pvals.values()) < P_THRESHOLD, f"{broken.__name__} was not caught: {pvals}"


def test_greedy_params_reduce_to_greedy_verify():
    torch.manual_seed(0)
    params = SamplingParams(temperature=0.0)
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        k = trial % 5
        logits = torch.randn(k + 1, 10)                                   # [K+1, V]
        target_ids = logits.argmax(-1).tolist()
        # drafts that agree with the target for a random prefix, then differ
        agree = int(torch.randint(0, k + 1, (1,)))
        tokens = [target_ids[i] if i < agree else (target_ids[i] + 1) % 10 for i in range(k)]
        draft_logits = torch.randn(k, 10)
        draft_logits[torch.arange(k), torch.tensor(tokens, dtype=torch.long)] = 10.0
        draft = Draft(tokens=tokens, probs=sampling_probs(draft_logits, params) if k else None)
        got = verify_sampling(draft, sampling_probs(logits, params), gen)
        want = verify_greedy(draft, target_ids)
        assert (got.accepted, got.next_token, got.path) == (want.accepted, want.next_token, want.path)


def test_identical_draft_and_target_accepts_everything():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 16), -1)                             # [K+1, V]
    for _ in range(100):
        tokens = [int(torch.multinomial(p[i], 1, generator=gen)) for i in range(3)]
        verdict = verify_sampling(Draft(tokens=tokens, probs=p[:3].clone()), p, gen)
        assert verdict.accepted == 3 and verdict.path == [0, 1, 2]


def test_rejection_never_emits_the_rejected_token_when_q_dominates():
    # q puts all mass on token 0; p gives token 0 only 0.3: a rejection must correct to another token.
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.3, 0.7, 0.0], [0.2, 0.2, 0.6]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    results = Counter()
    for _ in range(2000):
        v = verify_sampling(Draft(tokens=[0], probs=q), p, gen)
        results[(v.accepted, v.next_token if v.accepted == 0 else -1)] += 1
    assert set(results) <= {(1, -1), (0, 1)}
    assert abs(results[(1, -1)] / 2000 - 0.3) < 0.05


def test_k_zero_samples_from_the_first_row():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    v = verify_sampling(Draft(tokens=[]), p, gen)
    assert (v.accepted, v.next_token, v.path) == (0, 2, [])
    v = verify_sampling(Draft(tokens=[], probs=torch.zeros(0, 4)), p, gen)
    assert (v.accepted, v.next_token) == (0, 2)


def test_one_hot_draft_accepts_with_probability_p():
    gen = torch.Generator().manual_seed(3)
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    acc = sum(verify_sampling(Draft(tokens=[1]), p, gen).accepted for _ in range(4000))
    assert abs(acc / 4000 - 0.75) < 0.03


def test_errors_are_clear():
    gen = torch.Generator().manual_seed(0)
    p = torch.full((2, 4), 0.25)
    with pytest.raises(ValueError, match="q = 0"):
        verify_sampling(Draft(tokens=[1], probs=torch.tensor([[1.0, 0.0, 0.0, 0.0]])), p, gen)
    with pytest.raises(ValueError, match=r"K\+1=2"):
        verify_sampling(Draft(tokens=[1]), torch.full((3, 4), 0.25), gen)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        verify_sampling(Draft(tokens=[7]), p, gen)
    with pytest.raises(ValueError, match=r"draft.probs must be \[K=1, V=4\]"):
        verify_sampling(Draft(tokens=[1], probs=torch.full((1, 5), 0.2)), p, gen)
    with pytest.raises(ValueError, match="not a distribution"):
        verify_sampling(Draft(tokens=[]), torch.tensor([[math.nan, 0.5, 0.5, 0.0]]), gen)
    with pytest.raises(ValueError, match="tree"):
        verify_sampling(Draft(tokens=[1, 2], parents=[-1, -1]), torch.full((3, 4), 0.25), gen)


def test_inputs_are_not_mutated():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 6), -1)
    q = torch.softmax(torch.randn(2, 6), -1)
    p0, q0 = p.clone(), q.clone()
    draft = Draft(tokens=[1, 2], probs=q)
    for _ in range(50):
        verify_sampling(draft, p, gen)
    assert torch.equal(p, p0) and torch.equal(q, q0) and draft.tokens == [1, 2]


def test_seeded_generator_makes_verify_deterministic():
    p = torch.softmax(torch.randn(4, 9), -1)
    q = torch.softmax(torch.randn(3, 9), -1)
    draft = Draft(tokens=[0, 4, 8], probs=q)
    runs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(123)
        runs.append([(v.accepted, v.next_token) for v in (verify_sampling(draft, p, gen) for _ in range(30))])
    assert runs[0] == runs[1]


def test_exact_target_helper_sums_to_one():
    p, _ = oracles(8, 1)
    joint, marginals = exact_target(p)
    assert abs(sum(joint.values()) - 1) < 1e-9
    for m in marginals:
        assert abs(sum(m.values()) - 1) < 1e-9
    assert set(itertools.islice(joint, 1)) <= set(itertools.product(range(8), repeat=2))
