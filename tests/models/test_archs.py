"""The architectures against transformers' own GGUF loading, and each one's file-format facts.

Tiny random llama, qwen3, phi3 and gemma2 models are written as GGUF files the way llama.cpp's converter
writes them (tests/tiny_gguf.py: llama's q/k rows permuted, F32 or a mix of Q8_0, Q4_1 and Q4_K blocks);
speczoo reads them (zoo/gguf.py, the architecture's file) and so does transformers
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, with its own un-permutation and dequantizer).
Both in fp32: logits agree to round-off and greedy continuations are equal. Where transformers' GGUF
reader drops a hyper-parameter (gemma2's soft-caps and query scale, qwen3's head_dim, RoPE scalings, phi3's
window), the test gives it transformers' config explicitly, with the values the file holds.
The model contract (cache, trees, batch invariance, loader) over every architecture is test_models.py's.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from tiny import greedy, tiny_model
from tiny_gguf import write_arch_gguf

from speczoo.cache import KVCache
from speczoo.models.loader import build_model
from speczoo.zoo.gguf import gguf_model_args, iter_gguf_blocks, iter_gguf_tensors, open_gguf

NEW_ARCHS = ["llama", "qwen3", "phi3", "gemma2", "lfm2"]
PROMPT = torch.tensor([5, 80, 12, 255, 3, 9, 100, 42, 7, 1, 33, 260, 64, 18, 90, 2])   # 16 > gemma2's window 6


def ours_from_gguf(path, backend: str = "fp32"):
    r = open_gguf(path)
    args = gguf_model_args(r)
    return build_model(args, dict(iter_gguf_tensors(r)), backend), args


def reference(path, args, **config):
    """transformers' model of the GGUF at `path` in fp32, its config completed with `config` and with what
    its GGUF reader does not take from the file."""
    transformers = pytest.importorskip("transformers", reason="the reference is transformers (speczoo[check])")
    pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate installed")
    transformers.logging.set_verbosity_error()
    cfg = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    cfg.pad_token_id = None                      # phi3's default (32000) lies outside a tiny vocabulary
    if args.arch == "qwen3":
        cfg.head_dim = args.head_dim
    if args.arch == "lfm2":                      # its GGUF reader files the epsilon under rms_norm_eps
        cfg.norm_eps = args.norm_eps
    if args.arch == "gemma2":
        cfg.query_pre_attn_scalar = args.head_dim
        cfg.attn_logit_softcapping, cfg.final_logit_softcapping = args.attn_logit_softcap, args.final_logit_softcap
    for key, value in config.items():
        setattr(cfg, key, value)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=cfg,
                                                              dtype=torch.float32)
    return model.eval()


def assert_matches(ours, args, ref, prompt: torch.Tensor = PROMPT, n: int = 12) -> float:
    with torch.no_grad():
        want = ref(prompt[None]).logits[0]                                   # [S, V]
        got = ours(prompt, torch.arange(len(prompt)), KVCache(args, 64)).logits
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-5)
        ref_ids = ref.generate(prompt[None], max_new_tokens=n, do_sample=False, min_new_tokens=n)[0, len(prompt):]
        assert greedy(ours, args, prompt, n) == ref_ids.tolist()
    return float((got - want).abs().max())


@pytest.mark.parametrize("quant", ["F32", "mixed"])
@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_gguf_matches_transformers(arch, quant, tmp_path):
    path, args, expected = write_arch_gguf(tmp_path / f"{arch}.gguf", arch, quant, ffn_dim=256)
    ours, got_args = ours_from_gguf(path)
    # eos: the vocabulary's end tokens; the epsilon as GGUF stores it, in fp32
    assert replace(got_args, eos_ids=[], norm_eps=args.norm_eps) == args and got_args.eos_ids
    assert got_args.norm_eps == pytest.approx(args.norm_eps, rel=1e-7)
    r = open_gguf(path)
    for name, t in iter_gguf_tensors(r):            # the file's values, in the model's row order, bit for bit
        assert torch.equal(t, expected[name]), name
    if quant == "mixed":
        kinds = {kind for _, kind, _ in iter_gguf_blocks(r)}
        assert {"Q8_0", "Q4_K"} <= kinds and ({"Q4_1"} <= kinds or arch == "gemma2"), kinds
    assert_matches(ours, args, reference(path, args))


def test_llama3_rope_frequencies_match_transformers(tmp_path):
    """Llama 3.1's RoPE scaling, as the converter stores it (rope_freqs, one divisor per frequency) against
    transformers' llama3 rope computed from the config."""
    rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64)
    head_dim, theta = 16, 10_000.0
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    lo, hi = 64 / rope["low_freq_factor"], 64 / rope["high_freq_factor"]
    factors = []
    for f in freqs.tolist():                      # the converter's formula (llama.cpp conversion/llama.py)
        wavelen = 2 * math.pi / f
        if wavelen < hi:
            factors.append(1.0)
        elif wavelen > lo:
            factors.append(rope["factor"])
        else:
            smooth = (64 / wavelen - rope["low_freq_factor"]) / (rope["high_freq_factor"] - rope["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    assert 1.0 in factors and 8.0 in factors and any(1 < f < 8 for f in factors)
    path, args, _ = write_arch_gguf(tmp_path / "l3.gguf", "llama", extra={"rope_freqs.weight": torch.tensor(factors)})
    ours, _ = ours_from_gguf(path)
    long_prompt = torch.arange(48) * 7 % 260
    assert_matches(ours, args, reference(path, args, rope_parameters={**rope, "rope_theta": theta}), long_prompt)
    plain, _ = tiny_model("llama", vocab=args.vocab_size)
    assert not torch.allclose(plain(long_prompt, torch.arange(48), KVCache(args, 64)).logits,
                              ours(long_prompt, torch.arange(48), KVCache(args, 64)).logits, atol=1e-3)


def test_llama_linear_rope_scaling_matches_transformers(tmp_path):
    path, args, _ = write_arch_gguf(tmp_path / "lin.gguf", "llama", rope_scale=4.0)
    ours, got = ours_from_gguf(path)
    assert got.rope_scale == 4.0
    assert_matches(ours, args, reference(path, args, rope_parameters=dict(rope_type="linear", factor=4.0,
                                                                          rope_theta=args.rope_theta)))


def test_phi3_longrope_and_window_match_transformers(tmp_path):
    """Phi-3's LongRoPE (short factors within the original context, cos/sin times the attention factor)
    and a sliding window on every layer."""
    original, context = 64, 4096
    attn = math.sqrt(1 + math.log(context / original) / math.log(original))   # what the converter writes
    path, args, tensors = write_arch_gguf(tmp_path / "phi.gguf", "phi3", rope_factors=True, context_length=context,
                                          rope_max_positions=original, rope_attn_factor=attn, sliding_window=5,
                                          sliding_pattern=4)
    ours, got = ours_from_gguf(path)
    assert (got.rope_max_positions, got.sliding_window, got.context_length) == (original, 5, original)
    assert all(got.layer_is_sliding(i) for i in range(got.n_layers))
    rope = dict(rope_type="longrope", rope_theta=args.rope_theta, original_max_position_embeddings=original,
                short_factor=tensors["rope_factors_short.weight"].tolist(),
                long_factor=tensors["rope_factors_long.weight"].tolist())
    ref = reference(path, args, rope_parameters=rope, original_max_position_embeddings=original,
                    max_position_embeddings=context, sliding_window=5)
    assert_matches(ours, args, ref, n=8)
    with pytest.raises(ValueError, match="past this model's RoPE"):
        ours(torch.tensor([1]), torch.tensor([original]), KVCache(got, original + 8))


def test_qwen3_head_dim_and_qk_norm_from_the_file(tmp_path):
    path, args, _ = write_arch_gguf(tmp_path / "q3.gguf", "qwen3")
    got = gguf_model_args(open_gguf(path))
    assert got.head_dim == 32 != got.dim // got.n_heads and got.qk_norm and not got.qkv_bias


def test_gemma2_metadata_defaults_are_llama_cpps(tmp_path):
    """A gemma2 file without soft-caps or a window gets llama.cpp's defaults (50, 30, 4096), a sliding
    window on every other layer starting with the first, one RoPE base, the embedding scaled by sqrt(D)."""
    import gguf

    path, _, _ = write_arch_gguf(tmp_path / "g2.gguf", "gemma2")
    r = open_gguf(path)
    w = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "gemma2")
    skip = ("gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping", "gemma2.attention.sliding_window")
    for key, field in r.fields.items():
        if key.startswith("gemma2.") and key not in skip:
            w.add_key_value(key, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    w.add_token_list(r.fields["tokenizer.ggml.tokens"].contents())
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    a = gguf_model_args(open_gguf(tmp_path / "bare.gguf"))
    assert (a.attn_logit_softcap, a.final_logit_softcap, a.sliding_window) == (50.0, 30.0, 4096)
    assert [a.layer_is_sliding(i) for i in range(4)] == [True, False, True, False]
    assert a.rope_local_theta == a.rope_theta and a.embed_scale == pytest.approx(math.sqrt(a.dim))


def test_mixture_of_experts_and_partial_rope_are_refused(tmp_path):
    import gguf

    for key, value, match in (("llama.expert_count", 8, "mixture of experts"),
                              ("llama.rope.dimension_count", 8, "partial RoPE")):
        path, _, _ = write_arch_gguf(tmp_path / "l.gguf", "llama")
        r = open_gguf(path)
        w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
        for k, field in r.fields.items():
            if k.startswith("llama.") and k != key:
                w.add_key_value(k, field.contents(), field.types[0])
        w.add_uint32(key, value)
        w.add_token_list(r.fields["tokenizer.ggml.tokens"].contents())
        w.add_tensor("token_embd.weight", r.tensors[0].data if r.tensors[0].name == "token_embd.weight" else
                     next(t.data for t in r.tensors if t.name == "token_embd.weight"))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(ValueError, match=match):
            gguf_model_args(open_gguf(tmp_path / "bad.gguf"))
