"""Tiny hand-made GGUF files (qwen2 with a byte-level BPE vocabulary, gemma3 with a SentencePiece one; any
architecture with the BPE one, written as llama.cpp's converter writes it) and a tiny Hugging Face
directory, for zoo and tokenizer tests without downloads.

    path, tensors = write_tiny_gguf(tmp_path / "q.gguf", "qwen2")
    path, args, tensors = write_arch_gguf(tmp_path / "l.gguf", "llama", quant="mixed")
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

from speczoo.models.args import ModelArgs
from speczoo.models.registry import arch_class
from speczoo.tokenizer import byte_alphabet

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

QWEN_MERGES = ["Ġ t", "h e", "Ġt he", "l l", "ll o", "he llo", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
               "Ġ hello", "i n", "Ġ in", "d e", "de f"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GEMMA_PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "t", "i", "n", "f", "he", "ll", "llo", "hello", "▁hello",
                "▁w", "or", "▁wor", "▁world", "▁t", "▁the", "in", "▁in", "日"]
# Runs of spaces: user-defined tokens spelled with real spaces, right after the specials (as Gemma files have them).
GEMMA_SPACES = ["  ", "   "]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]


def qwen_vocab(pad_to: int | None = None) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): the 256 byte-alphabet letters, the merge results, the specials, then
    (pad_to) "[PAD<id>]" tokens of type UNUSED up to pad_to ids, as llama.cpp's converter pads a vocabulary
    to its embedding's rows."""
    tokens = [byte_alphabet()[b] for b in range(256)]
    for m in QWEN_MERGES:
        joined = m.replace(" ", "")
        if joined not in tokens:
            tokens.append(joined)
    types = [1] * len(tokens) + [3] * len(QWEN_SPECIALS)
    tokens += QWEN_SPECIALS
    pads = [f"[PAD{i}]" for i in range(len(tokens), pad_to or 0)]
    return tokens + pads, types + [5] * len(pads), QWEN_MERGES


def gemma_vocab() -> tuple[list[str], list[int], list[float]]:
    """(tokens, token types, scores): specials, user-defined newline and space runs, 256 byte pieces, some
    pieces (scores falling with position, as in Gemma files)."""
    user = ["\n", *GEMMA_SPACES]
    tokens = GEMMA_SPECIALS + user + [f"<0x{b:02X}>" for b in range(256)] + GEMMA_PIECES
    types = [3] * len(GEMMA_SPECIALS) + [4] * len(user) + [6] * 256 + [1] * len(GEMMA_PIECES)
    scores = [-1000.0] * (len(GEMMA_SPECIALS) + len(user)) + [0.0] * 256 + [-float(i) for i in range(len(GEMMA_PIECES))]
    return tokens, types, scores


def _write_tokenizer(w: gguf.GGUFWriter, arch: str, chat_template: bool | str, pad_to: int | None = None) -> int:
    if arch == "qwen2":
        tokens, types, merges = qwen_vocab(pad_to)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(tokens.index("<|endoftext|>"))
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_add_bos_token(False)
        if chat_template is True:
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
    if isinstance(chat_template, str):
        w.add_chat_template(chat_template)
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


def write_sizes(w: gguf.GGUFWriter, args: ModelArgs, context_length: int) -> None:
    """The hyper-parameters every architecture's converter writes."""
    w.add_block_count(args.n_layers)
    w.add_context_length(context_length)
    w.add_embedding_length(args.dim)
    w.add_feed_forward_length(args.ffn_dim)
    w.add_head_count(args.n_heads)
    if args.conv_layers:     # a hybrid's per-layer list, 0 for a layer without attention (llama.cpp's converter)
        w.add_head_count_kv([0 if i in args.conv_layers else args.n_kv_heads for i in range(args.n_layers)])
    else:
        w.add_head_count_kv(args.n_kv_heads)
    w.add_rope_freq_base(args.rope_theta)
    w.add_layer_norm_rms_eps(args.norm_eps)


def write_tiny_gguf(path: Path, arch: str, seed: int = 0, tied: bool = True, quantize: bool = True,
                    chat_template: bool | str = True, linear_type: str | None = None, pad_to: int | None = None,
                    **overrides) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny `arch` GGUF; returns (path, the fp32 tensors as the reader will dequantize them).

    chat_template: True writes ChatML (qwen2 only), a string writes that template, False none.
    linear_type: every 2-D tensor (the linear weights and the embedding) stored in that GGUF type
    (`typed_blocks`); overrides: ModelArgs fields (dims that are multiples of 256 for the K and IQ types).
    pad_to (qwen2 only): zero embedding (and LM head) rows and "[PAD<id>]" tokens up to this many ids
    (qwen_vocab), the other tensors those of the unpadded model."""
    vocab = len(qwen_vocab()[0]) if arch == "qwen2" else len(gemma_vocab()[0])
    tensors = tiny_tensors(tiny_args(arch, vocab=vocab, tie_embeddings=tied, **overrides), seed, tied=tied)
    for name in ("token_embd.weight", "output.weight"):
        if pad_to and name in tensors:
            t = tensors[name]
            tensors[name] = torch.cat((t, t.new_zeros(pad_to - vocab, t.shape[1])))
    args = tiny_args(arch, vocab=max(vocab, pad_to or 0), tie_embeddings=tied, **overrides)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    write_sizes(w, args, 4096)
    if arch == "gemma3":
        w.add_key_length(args.head_dim)
        w.add_value_length(args.head_dim)
        w.add_sliding_window(args.sliding_window)
    _write_tokenizer(w, arch, chat_template, pad_to)
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


# ---------------------------------------------------------------- any architecture, as the converter writes it

def _quant_type(name: str, shape: tuple[int, ...], quant: str) -> gguf.GGMLQuantizationType:
    """F32 everywhere ("F32"), or a mix like a real file's ("mixed"): Q8_0 embedding and attention, Q4_1
    gate/up (SmolLM2's type), Q4_K ffn_down when its rows are whole super-blocks, else Q5_0."""
    T = gguf.GGMLQuantizationType
    if quant == "F32" or len(shape) != 2 or shape[1] % 32:
        return T.F32
    if "ffn_down" in name:
        return T.Q4_K if shape[1] % 256 == 0 else T.Q5_0
    if "ffn_gate" in name or "ffn_up" in name:
        return T.Q4_1
    return T.Q8_0


def _encode(a: np.ndarray, qtype: gguf.GGMLQuantizationType, seed: int) -> np.ndarray:
    """`a` [N, K] in blocks of `qtype`: gguf's quantizer where it has one; Q4_K (which gguf cannot quantize)
    as random valid blocks of the same shape and about the same magnitude (d, dmin 1e-4), which is all a
    loader test needs: the values are whatever the blocks decode to."""
    if qtype != gguf.GGMLQuantizationType.Q4_K:
        return gguf.quants.quantize(a, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(a.shape[0], a.shape[1] // block, size), dtype=np.uint8)
    raw[..., 0:4] = np.array([1e-4, 1e-4], dtype=np.float16).view(np.uint8)   # d, dmin
    return raw.reshape(a.shape[0], -1)


def _converter_rows(name: str, t: torch.Tensor, args: ModelArgs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the tensor's rows as llama.cpp's converter writes them, the architecture's row order that undoes
    it): llama's q/k permuted per head, every other tensor as it is (order None)."""
    order = arch_class(args.arch).source_rows(name, t.shape[0], args)
    if order is None:
        return t, None
    out = torch.empty_like(t)
    out[order] = t                                     # file row order[r] holds model row r
    return out, order


def _arch_metadata(w: gguf.GGUFWriter, args: ModelArgs, tensors: dict[str, torch.Tensor]) -> None:
    write_sizes(w, args, args.context_length)
    w.add_key_length(args.head_dim)
    w.add_value_length(args.head_dim)
    w.add_rope_dimension_count(args.head_dim)
    if args.rope_scale != 1.0:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(args.rope_scale)
    if args.arch == "gemma2":
        w.add_sliding_window(args.sliding_window)
        w.add_attn_logit_softcapping(args.attn_logit_softcap)
        w.add_final_logit_softcapping(args.final_logit_softcap)
    if args.arch == "lfm2":
        w.add_vocab_size(args.vocab_size)
        w.add_shortconv_l_cache(args.conv_kernel)
    if args.arch == "phi3":
        w.add_sliding_window(args.sliding_window)
        if "rope_factors_short.weight" in tensors:
            w.add_rope_scaling_orig_ctx_len(args.rope_max_positions)
            w.add_rope_scaling_attn_factors(args.rope_attn_factor)


def write_arch_gguf(path: Path, arch: str, quant: str = "F32", seed: int = 0, rope_factors: bool = False,
                    extra: dict[str, torch.Tensor] | None = None,
                    **overrides) -> tuple[Path, ModelArgs, dict[str, torch.Tensor]]:
    """A tiny random `arch` model written as llama.cpp's converter writes one (llama's q/k permuted, its
    metadata keys), with the byte-level BPE vocabulary of qwen_vocab() and a ChatML template, in the
    types `quant` picks (_quant_type). overrides: ModelArgs fields; rope_factors: see tiny.tiny_tensors;
    extra: tensors added to (or replacing) the random ones.
    Returns (path, the args, the fp32 tensors the model should read: the file's values, dequantized, in
    the model's row order)."""
    args = tiny_args(arch, vocab=len(qwen_vocab()[0]), **overrides)
    tensors = {**tiny_tensors(args, seed, tied=args.tie_embeddings, rope_factors=rope_factors), **(extra or {})}
    w = gguf.GGUFWriter(str(path), arch)
    _arch_metadata(w, args, tensors)
    _write_tokenizer(w, "qwen2", chat_template=True)             # the byte-level BPE vocabulary, ChatML
    expected = {}
    for name, t in tensors.items():
        written, order = _converter_rows(name, t, args)
        a = written.numpy().astype(np.float32)
        qtype = _quant_type(name, a.shape, quant)
        if qtype != gguf.GGMLQuantizationType.F32:
            q = _encode(a, qtype, seed)
            w.add_tensor(name, q, raw_dtype=qtype)
            a = gguf.quants.dequantize(q, qtype)
        else:
            w.add_tensor(name, a)
        back = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        expected[name] = back if order is None else back[order]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path), args, expected
