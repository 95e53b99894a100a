"""speczoo/context.py: --max-seq's default (the model's own context, capped by memory, with the line that
says which cap applied), --kv-type's names, and what a Runtime builds from them (tiny models)."""

import pytest
import torch

from tiny import tiny_model

from speczoo.context import (DEFAULT_KV_TYPE, KV_MEMORY_SHARE, MAX_SEQ_STEP, available_memory, choose_max_seq,
                             kv_bytes_per_token, kv_dtype)
from speczoo.models.args import ModelArgs

GIB = 2 ** 30


def test_kv_types_and_their_bytes():
    assert kv_dtype("f16") is torch.float16 and kv_dtype("f32") is torch.float32 and DEFAULT_KV_TYPE == "f16"
    with pytest.raises(ValueError, match="--kv-type must be one of f16, f32, got 'q8'"):
        kv_dtype("q8")
    args = ModelArgs(arch="qwen2", vocab_size=100, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64,
                     ffn_dim=4864)
    assert kv_bytes_per_token(args, torch.float32) == 2 * 24 * 2 * 64 * 4            # Qwen2.5-0.5B: 24 KiB
    assert kv_bytes_per_token(args, torch.float16) == 2 * 24 * 2 * 64 * 2


def test_the_models_own_context_when_memory_holds_it():
    c = choose_max_seq(None, 32768, 12288, 8 * GIB, "f16")
    assert c.max_seq == 32768
    assert c.reason.startswith("--max-seq 32768: the model's own context length") and "384 MiB" in c.reason


def test_memory_caps_the_context_and_says_so():
    per_token = 2 * 36 * 8 * 128 * 2                       # an 8B shape in f16: 144 KiB a token
    c = choose_max_seq(None, 131072, per_token, 4 * GIB, "f16")
    fits = int(KV_MEMORY_SHARE * 4 * GIB) // per_token
    assert c.max_seq == fits // MAX_SEQ_STEP * MAX_SEQ_STEP < 131072
    assert c.max_seq * per_token <= KV_MEMORY_SHARE * 4 * GIB
    assert "capped by memory" in c.reason and "the model's own context is 131072" in c.reason
    assert "\n" not in c.reason


def test_too_little_memory_and_bad_values_are_clear_errors():
    with pytest.raises(ValueError, match="too little for a KV cache of 256 tokens"):
        choose_max_seq(None, 32768, 1 << 20, 100 << 20)
    for bad in (1, 0, -5):
        with pytest.raises(ValueError, match=f"--max-seq must be at least 2, got {bad}"):
            choose_max_seq(bad, 32768, 1000, 8 * GIB)


def test_a_given_max_seq_is_kept_and_said():
    c = choose_max_seq(1024, 32768, 12288, 0, "f32")
    assert c.max_seq == 1024 and c.reason.startswith("--max-seq 1024 as given (KV f32")
    beyond = choose_max_seq(65536, 32768, 12288, 0)
    assert beyond.max_seq == 65536 and "beyond the model's own context of 32768" in beyond.reason


def test_available_memory_reads_the_machine():
    assert available_memory() > 0


@pytest.mark.parametrize("kv_type,dtype", (("f16", torch.float16), ("f32", torch.float32)))
def test_a_runtime_sizes_and_types_its_caches(kv_type, dtype, monkeypatch):
    """Runtime: the target's cache, the draft model's and a batch's slots in --kv-type; the default context is
    the model's own (tiny: 256) unless memory caps it."""
    from speczoo import runtime as rt_mod
    from speczoo.runtime import LoadedModel, Runtime

    model, args = tiny_model("qwen2", backend="q4")
    args.context_length = 256
    tok = _tokenizer()
    loaded = LoadedModel(name="tiny", path=None, args=args, model=model, tokenizer=tok, backend="q4")
    monkeypatch.setattr(rt_mod, "runtime_costs", _no_costs)
    monkeypatch.setattr(rt_mod, "load_eagle", lambda *a, **k: None)
    monkeypatch.setattr(rt_mod, "available_memory", lambda: 64 * GIB)
    rt = Runtime(loaded, kv_type=kv_type)
    assert rt.max_seq == 256 and "the model's own context length" in rt.context_note
    assert rt.engine.cache.k[0].dtype == dtype and rt.engine.cache.max_seq == 256
    assert rt.slot_bytes() == kv_bytes_per_token(args, dtype) * (256 + rt.engine.cache.capacity - 256)
    args.context_length = 1024
    monkeypatch.setattr(rt_mod, "available_memory", lambda: 2 * 300 * kv_bytes_per_token(args, dtype))
    capped = Runtime(loaded, kv_type=kv_type)
    assert capped.max_seq == MAX_SEQ_STEP and "capped by memory" in capped.context_note
    assert Runtime(loaded, max_seq=100, kv_type=kv_type).max_seq == 100
    with pytest.raises(ValueError, match="--max-seq must be at least 2"):
        Runtime(loaded, max_seq=1)


def _no_costs(target, draft, **kw):
    """runtime_costs without timing anything: no measured costs (the engine then offers what costs nothing)."""
    return None, None


def _tokenizer():
    from fake_runtime import FakeTokenizer
    return FakeTokenizer()
