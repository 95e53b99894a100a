"""Llama (Llama 2, Llama 3.x, Mistral, SmolLM, TinyLlama, the DeepSeek-R1-Distill-Llama models): the Qwen2
block without q/k/v bias (a bias when the file has one), NEOX RoPE after undoing the converter's q/k row
permutation, a SiLU gated MLP.

GGUF tensors (blk.N.): attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
ffn_down; token_embd, output_norm, output (absent when tied), rope_freqs (Llama 3.1 and later: one divisor
per frequency, [head_dim / 2]). Mistral files are arch llama too. A mixture of experts (Mixtral) is
refused (zoo/gguf.py).

RoPE: llama.cpp's converter permutes the rows of attn_q and attn_k within each head so that its
ROPE_TYPE_NORM (rotating adjacent pairs) computes what the original model computes by rotating halves;
`source_rows` gives back the original row order, exactly (a row permutation of the file's blocks), so
this model rotates halves like every other here and runs on the compiled block (kernels/block.py).
Scaling: rope_freqs divides the frequencies (llama.cpp's freq_factors); `rope.scaling.type` linear (or a
bare rope.scaling.factor, llama.cpp's default type) divides them all by the factor; any other type is
refused.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from speczoo.models.args import ModelArgs
from speczoo.models.decoder import Decoder, Layout
from speczoo.models.meta import GGUFMeta

_PERMUTED = re.compile(r"^blk\.\d+\.(attn_q|attn_k)\.(weight|bias)$")


def unpermute_rows(n_rows: int, n_head: int) -> Tensor:
    """The inverse of the converter's per-head permutation, as a row order (int64 [n_rows]): within head h,
    model row h*Dh + half*Dh/2 + i is file row h*Dh + 2i + half."""
    dh = n_rows // n_head
    if dh * n_head != n_rows or dh % 2:
        raise ValueError(f"{n_rows} rows do not split into {n_head} heads of an even size; the file is inconsistent")
    h = torch.arange(n_head)[:, None, None]
    half = torch.arange(2)[None, :, None]
    i = torch.arange(dh // 2)[None, None, :]
    return (h * dh + 2 * i + half).reshape(-1)                     # [H, 2, Dh/2] in model order


class Llama(Decoder):
    ARCH = "llama"
    LAYOUT = Layout(attn_norm="attn_norm", qkv=("attn_q", "attn_k", "attn_v"), wo="attn_output",
                    ffn_norm="ffn_norm", gate_up=("ffn_gate", "ffn_up"), down="ffn_down")
    ROPE_FACTORS = "rope_freqs.weight"

    @classmethod
    def args_from_gguf(cls, meta: GGUFMeta) -> ModelArgs:
        kind = meta.get("rope.scaling.type")
        factor = float(meta.get("rope.scaling.factor", 0.0) or meta.get("rope.scale_linear", 0.0) or 0.0)
        scale = 1.0
        if kind in (None, "linear") and factor not in (0.0, 1.0):
            scale = factor
        elif kind not in (None, "none", "linear") and factor not in (0.0, 1.0):
            raise ValueError(f"RoPE scaling {kind!r} is not supported for llama (linear and Llama 3's rope_freqs "
                             "are); this model would run incorrectly")
        return ModelArgs(**meta.common, qkv_bias=meta.has_tensor("blk.0.attn_q.bias"), act="silu", rope_scale=scale)

    @classmethod
    def source_rows(cls, name: str, n_rows: int, args: ModelArgs) -> Tensor | None:
        m = _PERMUTED.match(name)
        if m is None:
            return None
        return unpermute_rows(n_rows, args.n_heads if m.group(1) == "attn_q" else args.n_kv_heads)
