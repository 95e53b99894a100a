"""sampling.py: the logits -> distribution transform, seeded draws, and parameter validation."""

from __future__ import annotations

import math

import pytest
import torch

from speczoo.request import SamplingParams
from speczoo.sampling import greedy, make_generator, pick, probs, sample, validate


def test_greedy_is_one_hot_at_argmax_first_on_ties():
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 5.0, 1.0]])               # [S, V]
    p = probs(logits, SamplingParams(temperature=0.0))
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    assert greedy(logits).tolist() == [1, 0]
    assert pick(logits, SamplingParams(), None).tolist() == [1, 0]


def test_temperature_one_is_softmax_and_rows_sum_to_one():
    logits = torch.randn(4, 50)
    p = probs(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(p, torch.softmax(logits, -1))
    p2 = probs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(p2, torch.softmax(logits / 0.5, -1))
    assert torch.allclose(p2.sum(-1), torch.ones(4))


def test_top_k_keeps_exactly_k():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0, 0.0]])
    p = probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (p > 0).tolist() == [[False, True, True, False, False]]
    assert torch.allclose(p[0, [1, 2]], torch.softmax(torch.tensor([4.0, 3.0]), -1))
    # top_k >= V is off
    assert torch.allclose(probs(logits, SamplingParams(temperature=1.0, top_k=9)),
                          torch.softmax(logits, -1))


def test_top_p_keeps_the_smallest_set_reaching_p():
    base = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = base.log()
    p = probs(logits, SamplingParams(temperature=1.0, top_p=0.8))     # 0.5 + 0.3 reaches 0.8
    assert (p > 0).tolist() == [[True, True, False, False]]
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = probs(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert (p > 0).tolist() == [[True, True, True, False]]
    p = probs(logits, SamplingParams(temperature=1.0, top_p=0.1))     # always keeps the top token
    assert (p > 0).tolist() == [[True, False, False, False]]


def test_top_k_then_top_p_order():
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # top_k=3 renormalizes to 4/9, 3/9, 2/9; top_p=0.7 then keeps the first two (4/9 + 3/9 >= 0.7)
    p = probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.7))
    assert (p > 0).tolist() == [[True, True, False, False]]


def test_same_transform_for_target_and_draft_rows():
    # The transform is row-wise: processing rows together or apart gives the same distribution.
    logits = torch.randn(5, 30)
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.9)
    together = probs(logits, params)
    apart = torch.cat([probs(logits[i:i + 1], params) for i in range(5)])
    assert torch.allclose(together, apart)


def test_input_logits_are_not_mutated():
    logits = torch.randn(3, 10)
    before = logits.clone()
    probs(logits, SamplingParams(temperature=0.8, top_k=4, top_p=0.5))
    assert torch.equal(logits, before)


def test_seeded_sampling_is_reproducible_and_matches_distribution():
    p = torch.tensor([[0.1, 0.2, 0.7]]).repeat(20000, 1)
    a = sample(p, make_generator(7))
    b = sample(p, make_generator(7))
    assert torch.equal(a, b)
    freq = torch.bincount(a, minlength=3).float() / a.numel()
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.7]), atol=0.015)
    assert not torch.equal(sample(p, make_generator(8)), a)


def test_pick_samples_with_a_generator_and_refuses_without_one():
    logits = torch.tensor([[0.0, 0.0, 50.0]])
    assert pick(logits, SamplingParams(temperature=1.0), make_generator(0)).tolist() == [2]
    with pytest.raises(ValueError, match="Generator"):
        pick(logits, SamplingParams(temperature=1.0), None)


def test_unseeded_generator_works():
    g = make_generator(None)
    assert sample(torch.tensor([[0.0, 1.0]]), g).tolist() == [1]


@pytest.mark.parametrize("params,match", [
    (SamplingParams(temperature=-0.1), "temperature"),
    (SamplingParams(temperature=math.nan), "temperature"),
    (SamplingParams(temperature=1.0, top_p=0.0), "top_p"),
    (SamplingParams(temperature=1.0, top_p=1.5), "top_p"),
    (SamplingParams(temperature=1.0, top_k=-1), "top_k"),
    (SamplingParams(temperature=1.0, top_k=2.5), "top_k"),
])
def test_validation_errors(params, match):
    with pytest.raises(ValueError, match=match):
        validate(params)
    with pytest.raises(ValueError, match=match):
        probs(torch.randn(1, 4), params)


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match=r"\[S, V\]"):
        probs(torch.randn(4), SamplingParams(temperature=1.0))
    with pytest.raises(ValueError, match="NaN"):
        probs(torch.tensor([[0.0, math.nan]]), SamplingParams(temperature=1.0))
    with pytest.raises(ValueError, match="-inf"):
        probs(torch.full((1, 3), -math.inf), SamplingParams(temperature=1.0))
    with pytest.raises(ValueError, match="seed"):
        make_generator(-1)


def test_masked_logits_get_zero_probability():
    logits = torch.tensor([[0.0, -math.inf, 1.0]])
    p = probs(logits, SamplingParams(temperature=1.3))
    assert p[0, 1] == 0 and torch.isclose(p.sum(), torch.tensor(1.0))


def test_sample_never_draws_zero_probability_tokens_and_refuses_empty_rows():
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).repeat(5000, 1)
    ids = sample(p, make_generator(3))
    assert set(ids.tolist()) == {1, 3}
    unnormalized = torch.tensor([[0.0, 2.0, 0.0]])
    assert sample(unnormalized, make_generator(0)).tolist() == [1]
    with pytest.raises(ValueError, match="sums to 0"):
        sample(torch.zeros(1, 4), make_generator(0))
    with pytest.raises(ValueError, match="NaN"):
        sample(torch.tensor([[0.5, math.nan]]), make_generator(0))


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-40, 1e-8])
def test_a_tiny_temperature_is_the_greedy_limit_not_nan(temperature):
    # Found by the schemathesis run on the real model: temperature=3.9e-300 overflowed logits/T to inf
    # and the row became NaN ("cannot sample"). The limit T -> 0 is the argmax (uniform over ties).
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 5.0, 1.0], [-30.0, 40.0, 39.999]])   # [S, V]
    p = probs(logits, SamplingParams(temperature=temperature, top_k=2, top_p=0.9))
    assert torch.isfinite(p).all()
    assert p[0].tolist() == [0.0, 1.0, 0.0] and p[2].argmax() == 1
    assert p[1, 2] == 0 and p[1, 0] > 0 and p[1, 1] > 0
    ids = pick(logits, SamplingParams(temperature=temperature), make_generator(0))
    assert ids[0] == 1 and ids[1] in (0, 1) and ids[2] == 1
