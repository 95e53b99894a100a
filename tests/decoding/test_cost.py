"""The cost model: E(α, K), speedup, best K, break-even α, measured c_v curves, and `speczoo cost`."""

from __future__ import annotations

import json

import pytest

from speczoo.cli import main
from speczoo.decoding.pricing.cost import (CvCurve, best_k, break_even_alpha, ceiling, expected_tokens, round_cost,
                               speedup)


def test_expected_tokens():
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 8) == 9.0
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    # continuous near α = 1
    assert expected_tokens(1 - 1e-9, 8) == pytest.approx(9.0, rel=1e-6)
    with pytest.raises(ValueError, match="α"):
        expected_tokens(1.2, 3)
    with pytest.raises(ValueError, match="K"):
        expected_tokens(0.5, -1)


@pytest.mark.parametrize("cv,expected", [
    (1.0, [2.00, 2.47, 3.20, 4.33, 6.13]),
    (1.3, [1.54, 1.90, 2.46, 3.33, 4.71]),
])
def test_reproduces_the_seed_ngram_table(cv, expected):
    for alpha, want in zip([0.5, 0.6, 0.7, 0.8, 0.9], expected):
        b = best_k(alpha, cv, draft_cost=0.0, k_max=8)
        assert round(b.speedup, 2) == want, (alpha, b)
        assert b.k == 8      # free drafts and a flat c_v: the longest draft is best


def test_speedup_formula():
    assert speedup(0.8, 4, 1.5, draft_cost=0.2) == pytest.approx(expected_tokens(0.8, 4) / (0.8 + 1.5))
    assert round_cost(3, 1.2, 0.1, overhead=0.05) == pytest.approx(0.3 + 1.2 + 0.05)


def test_best_k_trades_draft_cost_against_acceptance():
    assert best_k(0.6, 1.0, draft_cost=0.3).k == 1
    assert best_k(0.9, 1.0, draft_cost=0.05).k > 4
    assert best_k(0.95, 1.0, draft_cost=0.0, k_max=3).k == 3
    with pytest.raises(ValueError, match="k_max"):
        best_k(0.5, 1.0, k_max=0)


def test_break_even():
    # flat c_v = 1: a draft costing r breaks even at α = r (K = 1: (1 + α) / (1 + r) >= 1)
    for r in (0.1, 0.3, 0.5):
        assert break_even_alpha(1.0, r) == pytest.approx(r, abs=1e-5)
    assert break_even_alpha(1.0, 0.0) == 0.0
    be0 = break_even_alpha(1.3, 0.0)          # free drafts: K = 8 and E(α, 8) = 1.3, α ≈ 0.2308
    assert expected_tokens(be0, 8) == pytest.approx(1.3, abs=1e-5)
    be = break_even_alpha(1.3, 0.2)
    assert best_k(be, 1.3, 0.2).speedup == pytest.approx(1.0, abs=1e-4)
    assert best_k(be - 0.01, 1.3, 0.2).speedup < 1.0
    assert break_even_alpha(3.0, 2.0, k_max=2) is None    # even α = 1: 3 / (4 + 3) < 1


def test_measured_curve_interpolates_and_extrapolates():
    c = CvCurve.measured({"1": 37.0, "2": 58.5, "5": 112.9, "9": 232.4})
    assert c(1) == 1.0
    assert c(2) == pytest.approx(58.5 / 37)
    assert c(3) == pytest.approx((58.5 + (112.9 - 58.5) / 3) / 37)
    assert c(9) == pytest.approx(232.4 / 37)
    slope = (232.4 - 112.9) / 4 / 37
    assert c(12) == pytest.approx(232.4 / 37 + 3 * slope)
    assert c(18) > c(17)
    with pytest.raises(ValueError, match="cannot be inferred"):
        c(19)
    with pytest.raises(ValueError, match="S >= 1"):
        c(0)
    # a forward of any width (a catch-up): the curve where readable, then proportional to S
    assert c.wide(12) == c(12) and c.wide(36) == pytest.approx(c(18) * 2)
    assert CvCurve.constant(1.3).wide(500) == 1.3


def test_measured_curve_errors():
    with pytest.raises(ValueError, match="S=1"):
        CvCurve.measured({"2": 1.5, "3": 2.0})
    with pytest.raises(ValueError, match="positive"):
        CvCurve.measured({"1": 1.0, "2": -1.0})
    with pytest.raises(ValueError, match="integer"):
        CvCurve.measured({"1": 1.0, "two": 2.0})
    only_one = CvCurve.measured({"1": 1.0})
    with pytest.raises(ValueError, match="cannot be inferred"):
        only_one(2)
    with pytest.raises(ValueError, match="positive"):
        CvCurve.constant(0.0)


def test_best_k_with_a_measured_curve_prefers_cheap_forwards():
    # c_v jumps after S = 5: the best K stops at 4 even for high α.
    curve = CvCurve.measured({1: 1.0, 2: 1.05, 3: 1.1, 5: 1.2, 6: 3.0, 9: 3.6})
    assert best_k(0.85, curve, 0.0, k_max=8).k == 4
    # the llama.cpp 1.5B curve from measurements.md: n-gram drafts only pay off at high α
    llama = CvCurve.measured({1: 1.0, 2: 1.58, 3: 2.09, 5: 3.05, 9: 6.28, 17: 7.84})
    assert best_k(0.5, llama).speedup < 1.0
    assert best_k(0.9, llama).speedup > 1.0
    assert break_even_alpha(llama, 0.71) is None


def test_cli_default_tables(capsys):
    assert main(["cost"]) == 0
    out = capsys.readouterr().out
    for cell in ["2.00×", "2.47×", "3.20×", "4.33×", "6.13×", "1.54×", "1.90×", "2.46×", "3.33×",
                 "4.71×", "break-even"]:
        assert cell in out


def test_cli_cv_json(tmp_path, capsys):
    f = tmp_path / "cv.json"
    f.write_text(json.dumps({"model": "x", "cv": {"1": 1.0, "2": 1.05, "5": 1.3, "9": 1.6}}))
    assert main(["cost", "--cv-json", str(f), "--draft-cost", "0.3", "--kmax", "8"]) == 0
    out = capsys.readouterr().out
    assert "cv.json" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"x": 1}))
    assert main(["cost", "--cv-json", str(bad)]) == 2
    assert '"cv"' in capsys.readouterr().err
    assert main(["cost", "--cv", "1,abc"]) == 2


def test_the_ceiling_is_every_draft_token_accepted_for_free():
    """Zen 3's 1.5B curve (docs/results.md): no drafter can give more than S / c_v(S) at its best S."""
    zen3 = {1: 1.0, 2: 1.16, 3: 1.29, 5: 1.79, 9: 3.22, 17: 6.21}
    top = ceiling(zen3)
    assert (top.k + 1, top.speedup) == (9, 9 / 3.22)                           # 2.795x; S = 5 gives 2.793x
    for a in (0.5, 0.9, 1.0):
        assert best_k(a, CvCurve.measured(zen3), 0.0, k_max=16).speedup <= top.speedup + 1e-9
    assert ceiling({"1": 1.0, "2": 1.0, "3": 1.5}).k == 1                      # ties: the smaller S
    with pytest.raises(ValueError, match="S >= 2"):
        ceiling({1: 1.0})


def test_cli_prints_the_ceiling(tmp_path, capsys):
    f = tmp_path / "cv.json"
    f.write_text(json.dumps({"cv": {"1": 1.0, "2": 1.16, "5": 1.79, "9": 3.22}}))
    assert main(["cost", "--cv-json", str(f)]) == 0
    out = capsys.readouterr().out
    assert "1.00 (ceiling)" in out and f"{9 / 3.22:.2f}×" in out


def test_a_curve_made_nondecreasing_keeps_its_rises_and_fills_its_dips():
    c = CvCurve.measured({1: 10.0, 2: 8.7, 3: 11.1, 5: 10.5, 9: 21.4}).nondecreasing()
    assert [c(s) for s in (1, 2, 3, 4, 5, 9)] == pytest.approx([1.0, 1.0, 1.11, 1.11, 1.11, 2.14])
    flat = CvCurve.constant(1.2)
    assert flat.nondecreasing() is flat
