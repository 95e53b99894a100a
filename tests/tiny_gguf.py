"""Tiny hand-made GGUF files (qwen2 with a byte-level BPE vocabulary, gemma3 with a SentencePiece one) and a
tiny Hugging Face directory, for zoo and tokenizer tests without downloads.

    path, tensors = write_tiny_gguf(tmp_path / "q.gguf", "qwen2")
    hf_dir, tensors = write_tiny_hf_dir(tmp_path / "hf", "gemma3")

Weights are tests/tiny.py's random tensors under GGUF names; the tokenizers are small but real (merges,
special tokens, byte fallback, a chat template for qwen2) so every tokenizer path runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tiny import tiny_args, tiny_tensors

from speczoo.tokenizer import byte_alphabet

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

QWEN_MERGES = ["Ġ t", "h e", "Ġt he", "l l", "ll o", "he llo", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
               "Ġ hello", "i n", "Ġ in", "d e", "de f"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GEMMA_PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "t", "i", "n", "f", "he", "ll", "llo", "hello", "▁hello",
                "▁w", "or", "▁wor", "▁world", "▁t", "▁the", "in", "▁in", "  ", "   ", "日"]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]


def qwen_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): the 256 byte-alphabet letters, the merge results, the specials."""
    tokens = [byte_alphabet()[b] for b in range(256)]
    for m in QWEN_MERGES:
        joined = m.replace(" ", "")
        if joined not in tokens:
            tokens.append(joined)
    types = [1] * len(tokens) + [3] * len(QWEN_SPECIALS)
    return tokens + QWEN_SPECIALS, types, QWEN_MERGES


def gemma_vocab() -> tuple[list[str], list[int], list[float]]:
    """(tokens, token types, scores): specials, a user-defined newline, 256 byte pieces, some pieces."""
    tokens = GEMMA_SPECIALS + ["\n"] + [f"<0x{b:02X}>" for b in range(256)] + GEMMA_PIECES
    types = [3] * len(GEMMA_SPECIALS) + [4] + [6] * 256 + [1] * len(GEMMA_PIECES)
    scores = [0.0] * (len(GEMMA_SPECIALS) + 1 + 256) + [-float(i) for i in range(len(GEMMA_PIECES))]
    return tokens, types, scores


def _write_tokenizer(w: gguf.GGUFWriter, arch: str, chat_template: bool) -> int:
    if arch == "qwen2":
        tokens, types, merges = qwen_vocab()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(tokens.index("<|endoftext|>"))
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_add_bos_token(False)
        if chat_template:
            w.add_chat_template(CHATML)
    else:
        tokens, types, scores = gemma_vocab()
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores(scores)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
        w.add_pad_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)
    return len(tokens)


# Byte offsets of the fp16 scales in one block of each type gguf cannot quantize (ggml-common.h), for
# blocks made by hand: random codes, these scales set so that the weights have a sane size.
F16_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
              "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
              "IQ4_NL": (0,), "IQ4_XS": (0,)}
UNDECODABLE = ("Q8_1", "Q8_K")     # types gguf can neither quantize nor dequantize (llama.cpp's internal ones)


def _set_scales(blocks: np.ndarray, kind: str, scale: np.ndarray) -> None:
    """Write fp16 `scale` [B] into every scale field of blocks [B, bytes per block] of `kind`."""
    h = scale.astype(np.float16).view(np.uint16)
    if kind == "IQ1_M":                       # the fp16 is spread over the top nibbles of 4 uint16 scales
        sc = blocks[:, 48:56].copy().view(np.uint16)                         # [B, 4]
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((h >> (4 * i)) & 0xF) << 12)
        blocks[:, 48:56] = sc.view(np.uint8)
        return
    for at in F16_SCALES[kind]:
        blocks[:, at:at + 2] = h.view(np.uint8).reshape(-1, 2)


def typed_blocks(a: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Weight `a` [N, K] fp32 as GGUF blocks of `kind` (uint8 [N, bytes per row]; F32 stays fp32): gguf's
    quantizer where it has one, else random codes under random scales sized like `a` (a valid tensor of
    that type, with the values gguf decodes, though not a quantization of `a`)."""
    qtype = gguf.GGMLQuantizationType[kind]
    try:
        return gguf.quants.quantize(a, qtype)
    except NotImplementedError:
        pass
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = a.size // block
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    if kind == "NVFP4":                       # 4 unsigned e4m3 scales per block: 2^-5 to 2^-4, halved
        blocks[:, :4] = rng.integers(16, 24, (n_blocks, 4), dtype=np.uint8)
    elif kind not in UNDECODABLE:             # (those stay random bytes: nobody reads them)
        _set_scales(blocks, kind, np.ones(n_blocks, dtype=np.float32))
        rms = float(np.sqrt(np.mean(gguf.quants.dequantize(blocks, qtype) ** 2)))
        _set_scales(blocks, kind, float(a.std()) / rms * rng.uniform(0.5, 1.5, n_blocks).astype(np.float32))
    return blocks.reshape(a.shape[0], -1)


def write_tiny_gguf(path: Path, arch: str, seed: int = 0, tied: bool = True, quantize: bool = True,
                    chat_template: bool = True, linear_type: str | None = None,
                    **overrides) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny `arch` GGUF; returns (path, the fp32 tensors as the reader will dequantize them).

    linear_type: every 2-D tensor (the linear weights and the embedding) stored in that GGUF type
    (`typed_blocks`); overrides: ModelArgs fields (dims that are multiples of 256 for the K and IQ types)."""
    vocab = len(qwen_vocab()[0]) if arch == "qwen2" else len(gemma_vocab()[0])
    args = tiny_args(arch, vocab=vocab, tie_embeddings=tied, **overrides)
    tensors = tiny_tensors(args, seed, tied=tied)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(args.n_layers)
    w.add_context_length(4096)
    w.add_embedding_length(args.dim)
    w.add_feed_forward_length(args.ffn_dim)
    w.add_head_count(args.n_heads)
    w.add_head_count_kv(args.n_kv_heads)
    w.add_rope_freq_base(args.rope_theta)
    w.add_layer_norm_rms_eps(args.norm_eps)
    if arch == "gemma3":
        w.add_key_length(args.head_dim)
        w.add_value_length(args.head_dim)
        w.add_sliding_window(args.sliding_window)
    _write_tokenizer(w, arch, chat_template)
    out = {}
    for name, t in tensors.items():
        a = t.numpy().astype(np.float32)
        if linear_type is not None and a.ndim == 2:
            qtype = gguf.GGMLQuantizationType[linear_type]
            q = np.ascontiguousarray(typed_blocks(a, linear_type, rng))
            w.add_tensor(name, q, raw_dtype=None if linear_type in ("F32", "F16") else qtype)
            if linear_type in UNDECODABLE:            # no values to give back
                a = np.full(a.shape, np.nan, dtype=np.float32)
            else:
                a = gguf.quants.dequantize(q.view(np.uint8) if linear_type != "F32" else q, qtype)
        elif quantize and name.endswith("ffn_up.weight") and a.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            a = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)
        out[name] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path), out


_HF_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "post_ffw_norm": "post_feedforward_layernorm"}


def _hf_name(name: str, arch: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    _, i, leaf, kind = name.split(".")
    table = dict(_HF_LAYER)
    table["ffn_norm"] = "post_attention_layernorm" if arch == "qwen2" else "pre_feedforward_layernorm"
    table["post_attention_norm"] = "post_attention_layernorm"
    return f"model.layers.{i}.{table[leaf]}.{kind}"


def write_tiny_hf_dir(path: Path, arch: str, seed: int = 1, tied: bool = True,
                      tokenizer_json: Path | None = None) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny HF-style directory; returns (dir, the tensors under GGUF names with GGUF value conventions).

    `tokenizer_json` is a tokenizer.json to copy (e.g. from a bundle of the tiny GGUF of the same arch).
    """
    path = Path(path)
    path.mkdir(parents=True)
    vocab = len(qwen_vocab()[0]) if arch == "qwen2" else len(gemma_vocab()[0])
    args = tiny_args(arch, vocab=vocab, tie_embeddings=tied)
    tensors = tiny_tensors(args, seed, tied=tied)
    hf = {}
    for name, t in tensors.items():
        v = t - 1.0 if arch == "gemma3" and name.endswith("norm.weight") else t  # HF Gemma stores w, GGUF 1 + w
        hf[_hf_name(name, arch)] = v.to(torch.bfloat16) if name.endswith("ffn_up.weight") else v.contiguous()
    save_file(hf, str(path / "model.safetensors"))
    expected = {k: t.clone() for k, t in tensors.items()}
    for name in expected:
        if name.endswith("ffn_up.weight"):
            expected[name] = hf[_hf_name(name, arch)].float()
    cfg = dict(vocab_size=vocab, hidden_size=args.dim, num_hidden_layers=args.n_layers,
               num_attention_heads=args.n_heads, num_key_value_heads=args.n_kv_heads, head_dim=args.head_dim,
               intermediate_size=args.ffn_dim, rms_norm_eps=args.norm_eps, rope_theta=args.rope_theta,
               tie_word_embeddings=tied, max_position_embeddings=4096)
    if arch == "qwen2":
        cfg.update(model_type="qwen2", hidden_act="silu", bos_token_id=vocab - 3, eos_token_id=vocab - 1)
        tc = {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": CHATML}
    else:
        cfg.update(model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh", sliding_window=args.sliding_window,
                   sliding_window_pattern=args.sliding_pattern, rope_local_base_freq=args.rope_local_theta,
                   query_pre_attn_scalar=args.head_dim, bos_token_id=2, eos_token_id=1)
        tc = {"bos_token": "<bos>", "eos_token": "<eos>", "add_bos_token": True}
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    if tokenizer_json is not None:
        (path / "tokenizer.json").write_bytes(Path(tokenizer_json).read_bytes())
    return path, expected
