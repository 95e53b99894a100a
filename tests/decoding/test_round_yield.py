"""What a confident drafter's rounds yielded: running means of tokens and cost per round."""

from __future__ import annotations

import pytest

from speczoo.decoding.round_yield import RoundYield


def test_the_yield_is_tokens_over_cost_once_it_has_its_rounds():
    y = RoundYield(weight=0.5, least=2)
    y.update(9, 4.0)                                      # the first round is the mean
    assert y.rate() is None                               # one round is not enough
    y.update(1, 2.0)
    assert y.tokens == pytest.approx(5.0) and y.cost == pytest.approx(3.0)
    assert y.rate() == pytest.approx(5.0 / 3.0)
    assert y.rate(extra=1.0) == pytest.approx(5.0 / 4.0)  # a catch-up charged on top
    y.update(1, 2.0)                                      # the latest round weighs `weight`
    assert y.rate() == pytest.approx(3.0 / 2.5)


def test_the_yield_refuses_nonsense():
    for weight, least in ((0.0, 2), (1.5, 2), (0.5, 0)):
        with pytest.raises(ValueError):
            RoundYield(weight, least)
