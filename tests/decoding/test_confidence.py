"""The fit of a confident drafter's stated probabilities to what the target accepts (decoding/confidence.py)."""

import random

import pytest

from speczoo.decoding.confidence import HIGHEST, LOWEST, ConfidenceFit


def judge(fit: ConfidenceFit, rng: random.Random, gamma: float, rounds: int, k: int = 4) -> None:
    """Rounds of k tokens whose confidences are uniform in [0.3, 1) and each kept with chance p^gamma,
    judged up to and including the first one the target turns down."""
    for _ in range(rounds):
        ps = [rng.uniform(0.3, 1.0) for _ in range(k)]
        accepted = 0
        while accepted < k and rng.random() < ps[accepted] ** gamma:
            accepted += 1
        fit.update(ps, k, accepted)


def test_taken_at_its_word_before_any_evidence():
    fit = ConfidenceFit()
    assert fit.exponent == 1.0 and fit.evidence == 0.0
    assert fit.floor(0.8) == 0.8
    assert fit.floor(0.0) == 0.0 and fit.floor(1.3) == 1.3      # never / always met either way


@pytest.mark.parametrize("gamma", [0.3, 1.0, 2.0])
def test_the_fit_finds_how_far_the_confidences_hold(gamma):
    """An under-confident drafter (its tokens kept more often than it says: gamma < 1) gets floors it reaches
    sooner, an over-confident one floors it reaches later, an honest one keeps its own (on a long memory,
    so that the estimate's noise is small)."""
    fit = ConfidenceFit(half_life=2000.0, window=2000)
    judge(fit, random.Random(5), gamma, 500)
    assert fit.exponent == pytest.approx(gamma, rel=0.25)
    assert fit.floor(0.8) == pytest.approx(0.8 ** (1 / gamma), abs=0.05)
    assert fit.floor(0.8) == pytest.approx(0.8 ** (1 / fit.exponent))


def test_little_evidence_moves_it_little():
    """Two rounds all accepted at low confidence: read as more than it says, but far from the bound a long
    record of the same would give."""
    few, many = ConfidenceFit(), ConfidenceFit()
    for _ in range(2):
        few.update([0.5, 0.5], 2, 2)
    for _ in range(200):
        many.update([0.5, 0.5], 2, 2)
    assert 0.3 < few.exponent < 1.0
    assert LOWEST <= many.exponent < 0.2
    for _ in range(200):
        many.update([0.99, 0.99], 2, 0)                  # and turned down though sure: the upper bound
    assert 3.0 < many.exponent <= HIGHEST


def test_only_the_judged_tokens_teach():
    """Tokens after the first one turned down, and those the target never ruled on (a draft cut to the
    budget), are not evidence; nor is a token with no confidence."""
    a, b = ConfidenceFit(), ConfidenceFit()
    a.update([0.6, 0.7, 0.9, 0.9], 4, 1)                 # the second turned down: two judged
    b.update([0.6, 0.7], 2, 1)
    assert a.exponent == b.exponent and a.evidence == b.evidence
    c = ConfidenceFit()
    c.update([0.6, 0.7, 0.9, 0.9], 2, 2)                 # four drafted, two ruled on, both kept
    d = ConfidenceFit()
    d.update([0.6, 0.7], 2, 2)
    assert c.exponent == d.exponent
    e = ConfidenceFit()
    e.update([0.0, 0.0], 2, 2)
    assert e.evidence == 0.0 and e.exponent == 1.0


def test_it_follows_a_text_that_changes():
    """Old evidence fades: after an easy stretch (kept far more than said) a hard one (kept as said)
    brings the exponent back near 1."""
    fit = ConfidenceFit()
    rng = random.Random(9)
    judge(fit, rng, 0.3, 150)
    easy = fit.exponent
    judge(fit, rng, 1.0, 300)
    assert easy < 0.5 and fit.exponent == pytest.approx(1.0, rel=0.25)
    assert len(fit._logp) <= fit.window


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="accepted"):
        ConfidenceFit().update([0.5, 0.5], 1, 2)
    with pytest.raises(ValueError, match="half_life"):
        ConfidenceFit(half_life=0)
