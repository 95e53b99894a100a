"""The kernel bench's floor (python -m benchmarks.kernel_bench --floor): its arithmetic, and a cached
timing that runs on a small shape. Speeds themselves are measured by the bench, never asserted here."""

import pytest
import torch

from benchmarks import kernel_bench as kb


def _timings(ms_by_s: dict[int, float]) -> dict[str, kb.ShapeTiming]:
    out = {}
    for name in kb.SHAPES:
        t = kb.ShapeTiming(name, 1)
        t.ms = dict(ms_by_s)
        t.best = dict(ms_by_s)
        out[name] = t
    return out


def test_the_floor_is_the_slower_of_streaming_the_weights_and_the_instructions():
    dram = _timings({1: 10.0, 9: 18.0})        # memory-bound at S = 1
    cached = _timings({1: 3.0, 9: 16.33})      # a row of instructions adds (16.33 - 3) / 8 = 1.67 (x 29 shapes)
    per_row = (kb.model_ms(cached, 9) - kb.model_ms(cached, 1)) / 8
    line = kb.floor_report(dram, cached, (1, 9))
    floor = 9 * per_row / kb.model_ms(dram, 1)
    assert f"floor {floor:.2f} ({1.8 / floor:.2f}x the floor)" in line
    cheap = _timings({1: 2.0, 9: 5.0})          # instructions cheaper than the stream: floor 1
    assert "floor 1.00 (1.80x the floor)" in kb.floor_report(dram, cheap, (1, 9))


def test_cached_timing_scales_a_slice_to_the_whole_shape():
    t = kb.time_shape_cached("q4", "k", 1, (1, 2), torch.Generator().manual_seed(0))
    assert t.ms[1] > 0 and t.ms[2] > 0
    assert t.bytes_per_copy > 256 * 1536 // 2           # the whole shape's bytes, not the slice's


@pytest.mark.parametrize("s", ["1", "9,9"])
def test_the_floor_with_one_s_value_is_a_clear_usage_error(s, capsys):
    with pytest.raises(SystemExit) as e:
        kb.main(["--floor", "--s", s, "--backend", "q4", "--shapes", "k"])
    assert e.value.code == 2
    assert "--floor needs two S values" in capsys.readouterr().err
