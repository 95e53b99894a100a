"""Qwen3 (dense: Qwen3-0.6B .. 32B): the Qwen2 block without q/k/v bias, with an RMSNorm over each head of
q and of k (before RoPE), NEOX RoPE, a SiLU gated MLP.

GGUF tensors (blk.N.): attn_norm, attn_q, attn_k, attn_v, attn_q_norm and attn_k_norm ([head_dim] each),
attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down; head_dim from attention.key_length (128, wider than
dim / n_heads on the small ones). Runs on the compiled block, its QK norm included (kernels/block.py).
"""

from __future__ import annotations

from speczoo.models.args import ModelArgs
from speczoo.models.decoder import Decoder, Layout
from speczoo.models.meta import GGUFMeta


class Qwen3(Decoder):
    ARCH = "qwen3"
    LAYOUT = Layout(attn_norm="attn_norm", qkv=("attn_q", "attn_k", "attn_v"), wo="attn_output",
                    ffn_norm="ffn_norm", gate_up=("ffn_gate", "ffn_up"), down="ffn_down",
                    qk_norm=("attn_q_norm", "attn_k_norm"))

    @classmethod
    def args_from_gguf(cls, meta: GGUFMeta) -> ModelArgs:
        meta.refuse_rope_scaling()
        return ModelArgs(**meta.common, qk_norm=True, act="silu")
