"""A tree drafter's accepted tokens per node budget, a(N): what one round shows, the prior, the fade."""

from __future__ import annotations

import pytest

from speczoo.decoding.pricing.cost import expected_tokens
from speczoo.decoding.tree_acceptance import TreeAcceptance


def test_before_any_round_a_tree_is_priced_as_the_chain_at_its_prior():
    est = TreeAcceptance(8, prior_alpha=0.6)
    for n in range(1, 9):
        assert est.expected_tokens(n) == pytest.approx(expected_tokens(0.6, n))


def test_one_round_shows_every_smaller_budget():
    est = TreeAcceptance(8, half_life=1e9, prior_weight=1e-9)
    # nodes 0 and 1 are siblings; the target took node 1, then node 3 below it, then node 6
    est.update(8, [1, 3, 6], judged=4)
    assert [round(est.accepted(n), 6) for n in range(1, 9)] == [0, 1, 1, 2, 2, 2, 3, 3]
    # a round of 2 nodes teaches budgets 1 and 2 only; the larger ones keep the first round's
    est.update(2, [0], judged=2)
    assert est.accepted(1) == pytest.approx(0.5) and est.accepted(2) == pytest.approx(1.0)
    assert est.accepted(4) == pytest.approx(2.0)


def test_the_estimate_never_falls_with_more_nodes_and_optimism_is_above_it():
    est = TreeAcceptance(8, half_life=1e9)
    for _ in range(5):
        est.update(3, [0, 1, 2], judged=3)        # short rounds that accepted everything
    est.update(8, [], judged=1)                    # one long round that missed at once
    values = [est.accepted(n) for n in range(1, 9)]
    assert values == sorted(values)
    for n in range(1, 9):
        assert est.expected_tokens(n) <= est.optimistic_tokens(n, 0.5, 0.99) <= expected_tokens(0.99, n) + 1e-9


def test_old_rounds_fade_per_judged_token():
    est = TreeAcceptance(4, half_life=4.0, prior_weight=1e-9)
    est.update(4, [0, 1, 2, 3], judged=4)
    est.update(4, [], judged=4)                    # the first round now counts half as much as this one
    assert est.accepted(4) == pytest.approx(4 * 0.5 / 1.5)


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ValueError, match="k_max"):
        TreeAcceptance(0)
    with pytest.raises(ValueError, match="path"):
        TreeAcceptance(4).update(2, [0, 3], judged=2)
    with pytest.raises(ValueError, match="node budget"):
        TreeAcceptance(4).accepted(5)
    est = TreeAcceptance(4)
    est.update(0, [], judged=0)                    # no draft: no evidence
    assert est.rounds == [0.0] * 5
