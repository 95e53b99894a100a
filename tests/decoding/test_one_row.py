"""The one-row prefetch choice (decoding/pricing/one_row.py): timed both ways in alternating blocks, the
prefetch kept only when it wins every round by the margin overall, within its time, and the model left set
to the choice (or as it was when no choice could be made)."""

from types import SimpleNamespace

import pytest

from speczoo.decoding.pricing.one_row import OneRowTiming, time_one_row
from speczoo.decoding.tuning import PRICING


def timed(model, ms_off: float, ms_on, seen: list[bool] | None = None):
    """A one-row forward of `model` costing ms_off without the prefetch and ms_on(round) with it (the
    round: the number of blocks timed with it so far, over the block size), recording each forward's side."""
    count = {True: 0}

    def forward() -> float:
        on = model.one_row_prefetch
        if seen is not None:
            seen.append(on)
        if not on:
            return ms_off
        count[True] += 1
        return ms_on((count[True] - 1) // PRICING.one_row_block)
    return forward


def test_a_clear_win_every_round_keeps_the_prefetch():
    model = SimpleNamespace(one_row_prefetch=False)
    seen: list[bool] = []
    got = time_one_row(model, timed(model, 50.0, lambda r: 45.0, seen))
    assert got == OneRowTiming(True, {"none": 50.0, "prefetch": 45.0}, PRICING.one_row_rounds)
    assert model.one_row_prefetch is True
    b = PRICING.one_row_block      # a warm forward, then blocks alternating which side goes first
    off, on = [False] * b, [True] * b
    assert PRICING.one_row_rounds == 3 and seen[1:] == off + on + on + off + off + on


@pytest.mark.parametrize("ms_on", [lambda r: 49.5,                        # under the margin
                                   lambda r: 55.0 if r == 1 else 40.0,    # lost one round
                                   lambda r: 52.0])                       # slower
def test_anything_short_of_a_clear_win_leaves_it_out(ms_on):
    model = SimpleNamespace(one_row_prefetch=True)
    got = time_one_row(model, timed(model, 50.0, ms_on))
    assert got is not None and got.prefetch is False and model.one_row_prefetch is False


def test_no_time_for_two_rounds_makes_no_choice_and_leaves_the_model_as_it_was():
    model = SimpleNamespace(one_row_prefetch=True)
    slow = PRICING.one_row_max_s * 1000 / (2 * PRICING.one_row_block * 1.5)      # 1.5 rounds fit
    assert time_one_row(model, timed(model, slow, lambda r: slow / 2)) is None and model.one_row_prefetch is True
    fast = 10.0                            # a cap below the default: the profile's budget's
    assert time_one_row(model, timed(model, fast, lambda r: 5.0), max_s=fast * 12 / 1000) is None
    two = time_one_row(model, timed(model, fast, lambda r: 5.0), max_s=fast * 17 / 1000)
    assert two is not None and two.rounds == 2 and two.prefetch


def test_the_timing_reads_back_from_a_profile():
    t = OneRowTiming(True, {"none": 48.9123, "prefetch": 45.8}, 3)
    assert OneRowTiming.from_json(t.to_json()) == OneRowTiming(True, {"none": 48.912, "prefetch": 45.8}, 3)
    for bad in (None, {}, {"prefetch": True}, {"prefetch": True, "ms": [], "rounds": 3}):
        assert OneRowTiming.from_json(bad) is None
    assert "kept: 45.80 ms with it, 48.91 ms without (-6.4%, 3 rounds)" in t.describe()
