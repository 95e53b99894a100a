"""Phi-3 (Phi-3 mini/medium, Phi-3.5-mini, Phi-4): one fused q/k/v projection and one fused gate/up
projection, NEOX RoPE with LongRoPE factors when the file has them, a SiLU gated MLP, no bias.

GGUF tensors (blk.N.): attn_norm, attn_qkv ([q; k; v] rows), attn_output, ffn_norm, ffn_up ([gate; up]
rows, as llama.cpp's SwiGLU splits it), ffn_down; token_embd, output_norm, output; rope_factors_short
and rope_factors_long ([head_dim / 2], the 128k-context models). A file with separate attn_q/k/v is
not read by this file.

RoPE: like llama.cpp with a context no longer than the original one (`rope.scaling.original_context_length`;
its default), the short factors divide the frequencies and cos/sin are multiplied by
`rope.scaling.attn_factor`; positions from the original context on are refused (the long factors are
not run). Sliding window: a file that sets `attention.sliding_window` gets it on every layer, as
transformers runs Phi-3 (llama.cpp currently disables Phi-3's window, so the two differ beyond it).
Runs on the compiled block (the fused tensors are the compiled block's fused operands).
"""

from __future__ import annotations

from speczoo.models.args import ModelArgs
from speczoo.models.decoder import Decoder, Layout
from speczoo.models.meta import GGUFMeta


class Phi3(Decoder):
    ARCH = "phi3"
    LAYOUT = Layout(attn_norm="attn_norm", qkv=("attn_qkv",), wo="attn_output", ffn_norm="ffn_norm",
                    gate_up=("ffn_up",), down="ffn_down")
    ROPE_FACTORS = "rope_factors_short.weight"

    @classmethod
    def args_from_gguf(cls, meta: GGUFMeta) -> ModelArgs:
        if not meta.has_tensor("blk.0.attn_qkv.weight"):
            raise ValueError("this phi3 file has no fused blk.N.attn_qkv tensors; speczoo reads Phi-3 files as "
                             "llama.cpp's converter writes them")
        c = dict(meta.common)
        longrope = meta.has_tensor(cls.ROPE_FACTORS)
        limit = 0
        if longrope:
            limit = int(meta.get("rope.scaling.original_context_length", c["context_length"]))
            c["context_length"] = min(c["context_length"], limit)
        else:
            meta.refuse_rope_scaling()
        window = int(meta.get("attention.sliding_window", 0) or 0)
        return ModelArgs(
            **c, act="silu",
            rope_local_theta=c["rope_theta"],              # a sliding layer turns like any other
            rope_attn_factor=float(meta.get("rope.scaling.attn_factor", 1.0)) if longrope else 1.0,
            rope_max_positions=limit,
            sliding_window=window, sliding_pattern=c["n_layers"] + 1 if window > 0 else 0,
        )
