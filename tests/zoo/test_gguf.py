"""GGUF -> ModelArgs and tensors: tiny GGUF files written with the gguf package, and the real ones."""


import gguf
import numpy as np
import pytest
import torch

from speczoo.cache import KVCache
from speczoo.models.loader import build_model
from speczoo.models.loader import dequantize
from speczoo.zoo.gguf import (LINEAR_WEIGHT_PATTERN, gguf_model_args, gguf_quant_summary, iter_gguf_blocks,
                              iter_gguf_tensors, open_gguf)
from real_models import GEMMA_NAME, QWEN_NAME, gguf_of
from tiny import tiny_args, tiny_tensors
from tiny_gguf import write_sizes

Q8 = gguf.GGMLQuantizationType.Q8_0


def write_gguf(path, args, tensors, *, pattern=None, quantize=True, vocab_texts=None):
    w = gguf.GGUFWriter(str(path), args.arch)
    write_sizes(w, args, args.context_length)
    if args.arch == "gemma3":
        w.add_key_length(args.head_dim)
        w.add_value_length(args.head_dim)
        w.add_sliding_window(args.sliding_window)
        if pattern is not None:
            w.add_sliding_window_pattern(pattern)
    texts = vocab_texts or [f"t{i}" for i in range(args.vocab_size)]
    w.add_token_list(texts)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    w.add_add_bos_token(args.arch == "gemma3")
    for name, t in tensors.items():
        a = t.numpy().astype(np.float32)
        if quantize and a.ndim == 2 and a.shape[1] % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(a, Q8), raw_dtype=Q8)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_tiny_gguf_round_trip(arch, tmp_path):
    args = tiny_args(arch, context_length=4096)
    tensors = tiny_tensors(args, seed=2)
    path = tmp_path / "m.gguf"
    write_gguf(path, args, tensors, pattern=args.sliding_pattern if arch == "gemma3" else None)
    r = open_gguf(path)
    got = gguf_model_args(r)
    assert got.arch == arch and got.vocab_size == args.vocab_size and got.dim == args.dim
    assert (got.n_layers, got.n_heads, got.n_kv_heads, got.head_dim, got.ffn_dim) == \
        (args.n_layers, args.n_heads, args.n_kv_heads, args.head_dim, args.ffn_dim)
    assert got.tie_embeddings and got.context_length == 4096 and got.eos_ids == [1]
    if arch == "gemma3":
        assert got.sliding_window == args.sliding_window and got.sliding_pattern == args.sliding_pattern
        assert got.qk_norm and got.sandwich_norms and got.act == "gelu_tanh" and got.bos_id == 2
        assert got.embed_scale == pytest.approx(args.dim ** 0.5) and got.query_scale == pytest.approx(args.head_dim ** -0.5)
        assert got.rope_local_theta == 10_000.0
    else:
        assert got.qkv_bias and got.act == "silu" and got.bos_id is None
    summary = gguf_quant_summary(r)
    assert summary["Q8_0"] > 0 and sum(summary.values()) == len(tensors)
    seen = {}
    for name, t in iter_gguf_tensors(r):
        assert t.dtype == torch.float32 and t.shape == tensors[name].shape, name   # torch [out, in]
        err = (t - tensors[name]).abs().max().item()
        assert err < 0.02 * tensors[name].abs().max().item() + 1e-7, name
        seen[name] = t
    assert set(seen) == set(tensors)
    model = build_model(got, seen, "fp32")          # the dequantized tensors build a working model
    out = model(torch.arange(5), torch.arange(5), KVCache(got, 8)).logits
    assert out.shape == (5, args.vocab_size) and torch.isfinite(out).all()


def test_tensors_and_blocks_are_ggufs_own_values(tmp_path):
    """iter_gguf_tensors gives gguf's dequantized values bit for bit (what bundles of format 1 stored), and
    iter_gguf_blocks the file's bytes, which decode to the same; `names` picks tensors without reading others."""
    args = tiny_args("qwen2")
    path = tmp_path / "m.gguf"
    write_gguf(path, args, tiny_tensors(args, seed=4))
    r = open_gguf(path)
    want = {t.name: np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32) for t in r.tensors}
    got = dict(iter_gguf_tensors(r))
    assert set(got) == set(want)
    for name, t in got.items():
        assert np.array_equal(t.numpy().view(np.int32), want[name].view(np.int32)), name
    picked = {"token_embd.weight", "blk.0.attn_q.bias"}
    blocks = {name: (kind, data) for name, kind, data in iter_gguf_blocks(r, picked)}
    assert set(blocks) == picked
    kind, data = blocks["token_embd.weight"]
    assert kind == "Q8_0" and data.dtype == torch.uint8
    assert torch.equal(dequantize(data.numpy(), kind), got["token_embd.weight"])
    kind, data = blocks["blk.0.attn_q.bias"]
    assert kind == "F32" and torch.equal(data, got["blk.0.attn_q.bias"])
    assert [n for n, _ in iter_gguf_tensors(r, {"output_norm.weight"})] == ["output_norm.weight"]


def test_gemma_sliding_pattern_as_per_layer_flags(tmp_path):
    args = tiny_args("gemma3", n_layers=6, sliding_pattern=3)
    path = tmp_path / "m.gguf"
    flags = [args.layer_is_sliding(i) for i in range(6)]
    write_gguf(path, args, tiny_tensors(args), pattern=flags, quantize=False)
    assert gguf_model_args(open_gguf(path)).sliding_pattern == 3
    bad = tmp_path / "bad.gguf"
    write_gguf(bad, args, tiny_tensors(args), pattern=[True, False, False, True, True, True], quantize=False)
    with pytest.raises(ValueError, match="not periodic"):
        gguf_model_args(open_gguf(bad))


def test_end_of_turn_tokens_join_eos(tmp_path):
    args = tiny_args("qwen2")
    texts = [f"t{i}" for i in range(args.vocab_size)]
    texts[7] = "<|im_end|>"
    path = tmp_path / "m.gguf"
    write_gguf(path, args, tiny_tensors(args), quantize=False, vocab_texts=texts)
    assert gguf_model_args(open_gguf(path)).eos_ids == [1, 7]


def test_unsupported_arch_is_a_clear_error(tmp_path):
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'mamba' is not supported; speczoo runs qwen2, qwen3, llama, phi3, gemma2, "
                                         "gemma3"):
        gguf_model_args(open_gguf(path))
    with pytest.raises(FileNotFoundError):
        open_gguf(tmp_path / "absent.gguf")


def test_linear_weight_pattern():
    for name in ("blk.0.attn_q.weight", "blk.11.ffn_down.weight", "output.weight", "token_embd.weight",
                 "blk.3.attn_qkv.weight"):
        assert LINEAR_WEIGHT_PATTERN.match(name), name
    for name in ("blk.0.attn_q.bias", "blk.0.attn_norm.weight", "blk.0.attn_q_norm.weight", "output_norm.weight",
                 "rope_freqs.weight", "rope_factors_short.weight", "blk.0.post_ffw_norm.weight"):
        assert not LINEAR_WEIGHT_PATTERN.match(name), name


@pytest.mark.real
def test_real_qwen_metadata():
    r = open_gguf(gguf_of(QWEN_NAME))
    a = gguf_model_args(r)
    assert (a.arch, a.n_layers, a.dim, a.n_heads, a.n_kv_heads, a.head_dim, a.ffn_dim, a.vocab_size) == \
        ("qwen2", 24, 896, 14, 2, 64, 4864, 151936)
    assert a.qkv_bias and not a.tie_embeddings and a.rope_theta == 1e6 and 151645 in a.eos_ids
    assert gguf_quant_summary(r) == {"F32": 121, "Q4_K": 12, "Q5_0": 133, "Q6_K": 12, "Q8_0": 13}


@pytest.mark.real
def test_real_gemma_metadata_and_orientation():
    r = open_gguf(gguf_of(GEMMA_NAME))
    a = gguf_model_args(r)
    assert (a.arch, a.n_layers, a.dim, a.n_heads, a.n_kv_heads, a.head_dim, a.vocab_size) == \
        ("gemma3", 18, 640, 4, 1, 256, 262144)
    assert (a.sliding_window, a.sliding_pattern, a.rope_local_theta, a.rope_theta) == (512, 6, 1e4, 1e6)
    assert a.tie_embeddings and a.query_scale == 1 / 16 and a.bos_id == 2 and 106 in a.eos_ids
    assert [i for i in range(18) if not a.layer_is_sliding(i)] == [5, 11, 17]
    for name, t in iter_gguf_tensors(r):
        if name == "blk.0.attn_q.weight":
            assert t.shape == (4 * 256, 640)      # [out, in]
        if name == "token_embd.weight":
            assert t.shape == (262144, 640)
            break


def test_the_plain_map_reader_reads_what_ggufs_own_reader_reads(tmp_path):
    """open_gguf is gguf.GGUFReader over a plain ndarray view of the map: every field and tensor the same."""
    args = tiny_args("qwen2")
    path = tmp_path / "t.gguf"
    write_gguf(path, args, tiny_tensors(args, seed=2))
    ours, theirs = open_gguf(path), gguf.GGUFReader(path)
    assert type(ours.data) is np.ndarray and isinstance(ours.data.base, np.memmap)     # zero-copy view
    assert list(ours.fields) == list(theirs.fields)
    assert all(ours.fields[k].contents() == theirs.fields[k].contents() for k in theirs.fields)
    assert [(t.name, t.tensor_type, t.shape.tolist()) for t in ours.tensors] == \
        [(t.name, t.tensor_type, t.shape.tolist()) for t in theirs.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(ours.tensors, theirs.tensors))


def test_a_truncated_gguf_is_a_clear_error(tmp_path):
    args = tiny_args("qwen2")
    path = tmp_path / "t.gguf"
    write_gguf(path, args, tiny_tensors(args, seed=2))
    whole = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for keep in (2, 2000, len(whole) - 100):         # in the magic, in the metadata, in the tensor data
        cut.write_bytes(whole[:keep])
        with pytest.raises(ValueError, match="is not a readable GGUF file"):
            open_gguf(cut)
