"""The draft-vocabulary bench (benchmarks/draft_vocab.py): its arguments and its coverage figure, without a model."""

import pytest


def test_draft_vocab_bench_checks_its_arguments_before_loading_anything():
    from benchmarks import draft_vocab
    with pytest.raises(ValueError, match="unknown built-in prompt 'nope'"):
        draft_vocab.main(["--prompts", "free_form,nope"])
    with pytest.raises(ValueError, match="sizes >= 0"):
        draft_vocab.main(["--vocab", "32768,-1"])


def test_coverage_and_mode_names():
    from benchmarks.draft_vocab import coverage, mode_name, parse_vocab

    assert parse_vocab("0,16384") == [0, 16384]
    assert coverage([1, 5, 40000, 7], 32768) == 0.75
    assert coverage([1, 40000], 0) == 1.0                       # the full head proposes any id
    assert mode_name(0) == "draft-full" and mode_name(32768) == "draft-v32768"


def test_r_by_weight_bytes_is_one_for_a_self_draft_and_shrinks_with_the_head():
    from types import SimpleNamespace

    from tiny import tiny_model

    from benchmarks.draft_vocab import byte_ratios, weight_bytes

    model, _ = tiny_model("qwen2", backend="q4", vocab=256)
    loaded = SimpleNamespace(model=model)
    r = byte_ratios(SimpleNamespace(target=loaded, draft=loaded), [0, 128, 64])
    assert r[0] == 1.0 and r[0] > r[128] > r[64]
    assert weight_bytes(model) > weight_bytes(model.lm_head) > 0
