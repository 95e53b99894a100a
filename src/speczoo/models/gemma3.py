"""Gemma 3 text decoder: scaled embeddings, q/k RMSNorm per head, sandwich norms, GELU-tanh MLP,
sliding-window attention on 5 of every 6 layers (local RoPE base) and global attention on the rest.

GGUF tensors (blk.N.): attn_norm, attn_q, attn_k, attn_v, attn_q_norm, attn_k_norm, attn_output,
post_attention_norm, ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffw_norm. llama.cpp's converter already
added gemma's +1 to every RMSNorm weight, so the plain RMSNorm applies them as they are. llama.cpp
hardcodes the sliding pattern (every 6th layer global), the local RoPE base 10000 and the query scale
1/sqrt(head_dim) (dim / n_heads for the 27B, 62 layers); so does this file. Runs its blocks in PyTorch
(the compiled block has no sandwich norms), its linears and attention compiled.
"""

from __future__ import annotations

import math

from speczoo.models.args import ModelArgs
from speczoo.models.decoder import Decoder, Layout
from speczoo.models.meta import GGUFMeta


class Gemma3(Decoder):
    ARCH = "gemma3"
    LAYOUT = Layout(attn_norm="attn_norm", qkv=("attn_q", "attn_k", "attn_v"), wo="attn_output",
                    ffn_norm="ffn_norm", gate_up=("ffn_gate", "ffn_up"), down="ffn_down",
                    qk_norm=("attn_q_norm", "attn_k_norm"), post_norms=("post_attention_norm", "post_ffw_norm"))
    CHAT_TEMPLATE = "gemma"

    @classmethod
    def args_from_gguf(cls, meta: GGUFMeta) -> ModelArgs:
        meta.refuse_rope_scaling()
        c = meta.common
        n_layers, dim = c["n_layers"], c["dim"]
        pre_attn = dim / c["n_heads"] if n_layers == 62 else c["head_dim"]
        return ModelArgs(
            **c,
            rope_local_theta=float(meta.get("rope.freq_base_swa", 10_000.0)),
            sliding_window=int(meta.get("attention.sliding_window", 0)),
            sliding_pattern=meta.sliding_pattern(6, n_layers),
            qk_norm=True, sandwich_norms=True, act="gelu_tanh", embed_scale=math.sqrt(dim),
            query_scale=1.0 / math.sqrt(pre_attn),
            final_logit_softcap=float(meta.get("final_logit_softcapping", 0.0) or 0.0),
        )
