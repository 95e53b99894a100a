"""The draft-price bench (python -m benchmarks.draft_price): every kind of forward is timed in one round on tiny
models, and its line prints r and the rows curve beside the stored one. Speeds are measured by the bench, never
asserted here."""

import pytest
import torch

from benchmarks import draft_price as dp


def test_a_round_times_every_kind_of_forward_and_its_line_prices_the_draft():
    from tiny import tiny_model

    from speczoo.decoding.drafters.draft_model import reduced_head
    from speczoo.decoding.pricing.profile import Series, _Forwards

    tm, ta = tiny_model("qwen2", backend="q4", vocab=512)
    dm, da = tiny_model("qwen2", backend="q4", vocab=512, seed=1)
    target = _Forwards(tm, ta, {"t": Series((1,))}, 40, 0)
    draft = _Forwards(dm, da, {"d": Series((1,), reduced_head(dm, 128))}, 40, 0)
    with torch.inference_mode():
        target.extend(8)
        draft.extend(8)
        m = dp.price_round(target, draft, steps=2)
    assert set(m) == {"target", "draft", "target_between", "draft_between", "rows2", "rows3", "rows5", "rows9"}
    assert all(v > 0 for v in m.values())
    assert target.context == draft.context == 8                  # every timed forward was rolled back
    line = dp.describe(m, {"1": 1.0, "2": 0.87, "9": 2.14})
    assert f"r = {m['draft'] / m['target']:.2f}" in line and "(stored: c(2) 0.87 c(9) 2.14)" in line
    assert "stored" not in dp.describe(m, None)


def test_bad_arguments_stop_before_anything_loads():
    with pytest.raises(SystemExit, match=">= 1"):
        dp.main(["--steps", "0"])
