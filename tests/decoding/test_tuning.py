"""Every decoding constant is a field of a frozen value in decoding/tuning.py (Tuning, Pricing, Drafting,
Batching), checked when it is made; docs/tuning.md has a row per field."""

import dataclasses
import math
import re
from pathlib import Path

import pytest

from speczoo.decoding.tuning import BATCHING, DRAFTING, PRICING, TUNING, Batching, Drafting, Pricing

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tuning.md"


@pytest.mark.parametrize("value, message", [
    (lambda: Pricing(recalibrate_every=0), "recalibrate_every"), (lambda: Pricing(half_life=0), "half_life"),
    (lambda: Pricing(cv_reach=0.5), "cv_reach"), (lambda: Pricing(round_overhead=math.nan), "round_overhead"),
    (lambda: Drafting(tree_decay=1.0), "tree_decay"), (lambda: Drafting(match_cap=0), "match_cap"),
    (lambda: Drafting(situation_priors={"1/agree": 1.0}), "situation priors"),
    (lambda: Batching(chunk=0), "chunk")])
def test_a_bad_constant_is_refused_when_made(value, message):
    with pytest.raises(ValueError, match=message):
        value()


def test_the_shipped_values_are_frozen_and_no_fading_is_allowed_for_benches():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRICING.half_life = 1.0
    with pytest.raises(TypeError):
        DRAFTING.situation_priors["1/agree"] = 0.5                       # read-only
    assert Pricing(stale_half_life=math.inf).stale_half_life == math.inf  # benchmarks/stale_ab.py's "none"


def test_every_field_has_its_row_in_docs_tuning():
    rows = DOCS.read_text(encoding="utf-8")
    for value in (TUNING, PRICING, DRAFTING, BATCHING):
        for f in dataclasses.fields(value):
            assert re.search(rf"^\| [^|]*`{f.name}`", rows, re.M), f"docs/tuning.md has no row for {f.name}"
