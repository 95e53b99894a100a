"""Gemma 2: scaled embeddings, sandwich norms, GELU-tanh MLP, attention-logit and final-logit
soft-capping, sliding-window attention on every other layer (layers 0, 2, 4, ...; one RoPE base for all).

GGUF tensors (blk.N.): attn_norm, attn_q, attn_k, attn_v, attn_output, post_attention_norm, ffn_norm,
ffn_gate, ffn_up, ffn_down, post_ffw_norm; no q/k norm; the LM head tied to token_embd (the converter
writes no output tensor). As llama.cpp: norms carry gemma's +1 already, the window defaults to 4096,
the soft-caps to 50 (attention) and 30 (final) when the file omits them, and the query scale is
1/sqrt(head_dim) (query_pre_attn_scalar; dim / n_heads for the 27B, 46 layers). Blocks run in PyTorch
(sandwich norms, soft-capping), their linears and their capped attention compiled (kernels/attention.py).
"""

from __future__ import annotations

import math

from speczoo.models.args import ModelArgs
from speczoo.models.decoder import Decoder, Layout
from speczoo.models.meta import GGUFMeta


class Gemma2(Decoder):
    ARCH = "gemma2"
    LAYOUT = Layout(attn_norm="attn_norm", qkv=("attn_q", "attn_k", "attn_v"), wo="attn_output",
                    ffn_norm="ffn_norm", gate_up=("ffn_gate", "ffn_up"), down="ffn_down",
                    post_norms=("post_attention_norm", "post_ffw_norm"))
    CHAT_TEMPLATE = "gemma"

    @classmethod
    def args_from_gguf(cls, meta: GGUFMeta) -> ModelArgs:
        meta.refuse_rope_scaling()
        c = meta.common
        n_layers, dim = c["n_layers"], c["dim"]
        pre_attn = dim / c["n_heads"] if n_layers == 46 else c["head_dim"]
        return ModelArgs(
            **c,
            rope_local_theta=float(meta.get("rope.freq_base_swa", c["rope_theta"])),
            sliding_window=int(meta.get("attention.sliding_window", 4096)),
            sliding_pattern=meta.sliding_pattern(2, n_layers),
            sandwich_norms=True, act="gelu_tanh", embed_scale=math.sqrt(dim),
            query_scale=1.0 / math.sqrt(pre_attn),
            attn_logit_softcap=float(meta.get("attn_logit_softcapping", 50.0)),
            final_logit_softcap=float(meta.get("final_logit_softcapping", 30.0)),
        )
