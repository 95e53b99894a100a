"""Qwen2 (Qwen2.5, Qwen2.5-Coder, the DeepSeek-R1-Distill-Qwen models): q/k/v with bias, NEOX RoPE, a SiLU
gated MLP, RMSNorm before attention and MLP.

GGUF tensors (blk.N.): attn_norm, attn_q/attn_k/attn_v (+ .bias), attn_output, ffn_norm, ffn_gate,
ffn_up, ffn_down; token_embd, output_norm, output (absent when tied). llama.cpp does not permute qwen2's
q/k, so RoPE rotates halves as transformers does. Runs on the compiled block (kernels/block.py).
"""

from __future__ import annotations

from speczoo.models.args import ModelArgs
from speczoo.models.decoder import Decoder, Layout
from speczoo.models.meta import GGUFMeta


class Qwen2(Decoder):
    ARCH = "qwen2"
    LAYOUT = Layout(attn_norm="attn_norm", qkv=("attn_q", "attn_k", "attn_v"), wo="attn_output",
                    ffn_norm="ffn_norm", gate_up=("ffn_gate", "ffn_up"), down="ffn_down")

    @classmethod
    def args_from_gguf(cls, meta: GGUFMeta) -> ModelArgs:
        meta.refuse_rope_scaling()
        return ModelArgs(**meta.common, qkv_bias=True, act="silu")
