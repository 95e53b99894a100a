"""The catch-up holes benchmark (benchmarks/catch_up_holes.py) on a tiny model drafting its own greedy text."""

from __future__ import annotations

import pytest

from benchmarks.auto_replay import Recording
from benchmarks.catch_up_holes import measure, report, sweep
from speczoo.cache import KVCache
from speczoo.decoding.drafters.draft_model import DraftModelDrafter
from tiny import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/fixtures.py


@pytest.fixture(scope="module")
def own_text():
    """A tiny model, a fresh drafter over it, and a recording of its own greedy continuation: with every id
    fed, each of its chains is right."""
    model, args = tiny_model("qwen2", vocab=256)

    def drafter(rec=None) -> DraftModelDrafter:
        return DraftModelDrafter(model, KVCache(args, 256))

    prompt = [5, 17, 3, 99, 42, 7, 250, 1]
    out = drafter().propose(prompt, 120).tokens
    return drafter, {"own": Recording(prompt=prompt, out=out, guess=[], sure=[])}


def test_with_every_id_fed_the_draft_says_its_own_text(own_text):
    drafter, recs = own_text
    q = measure(drafter, recs, lag=16, window=0, k=4)
    assert (q.accepted, q.first) == (4.0, 1.0) and q.samples == len(range(24, 120 - 4, 24))


def test_a_window_as_wide_as_the_lag_leaves_no_hole(own_text):
    drafter, recs = own_text
    rows = sweep(drafter, recs, lags=[16], windows=[0, 16, 40, 2], k=4)
    assert rows[0].accepted == rows[1].accepted == rows[2].accepted
    text = report(rows, 4)
    assert "all" in text.splitlines()[1] and "+0.0%" in text.splitlines()[2]


def test_a_recording_too_short_is_an_error(own_text):
    drafter, recs = own_text
    with pytest.raises(ValueError, match="no recording is long enough"):
        measure(drafter, recs, lag=200, window=0)
