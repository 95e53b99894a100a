"""Gemma 3 text decoder: scaled embeddings, q/k RMSNorm per head, sandwich norms, GELU-tanh MLP,
sliding-window attention on 5 of every 6 layers (local RoPE base) and global attention on the rest.

Tensor names are GGUF's. llama.cpp's converter already added gemma's +1 to every RMSNorm weight, so the
plain RMSNorm of models.base applies them as they are. This file never branches on the linear backend.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from speczoo.kernels.fused import FusedLinears
from speczoo.kernels.linear import LinearBackend
from speczoo.models.args import ModelArgs
from speczoo.models.base import (AttnPlan, DecoderBase, Mlp, RMSNorm, Rope, Rotation, apply_rope, attend,
                                 default_query_scale, make_linear, plan_attention, write_kv)


class Gemma3Block(nn.Module):
    def __init__(self, args: ModelArgs, i: int, tensors: Mapping[str, Tensor], backend: LinearBackend,
                 packed: Mapping[str, Tensor] | None):
        super().__init__()
        p = f"blk.{i}."
        eps = args.norm_eps
        self.sliding = args.layer_is_sliding(i)
        self.attn_norm = RMSNorm(tensors[p + "attn_norm.weight"], eps)
        self.qkv = FusedLinears([make_linear(p + "attn_q.weight", tensors, backend, packed),
                                 make_linear(p + "attn_k.weight", tensors, backend, packed),
                                 make_linear(p + "attn_v.weight", tensors, backend, packed)])
        self.wo = make_linear(p + "attn_output.weight", tensors, backend, packed)
        self.q_norm = RMSNorm(tensors[p + "attn_q_norm.weight"], eps)
        self.k_norm = RMSNorm(tensors[p + "attn_k_norm.weight"], eps)
        self.post_attn_norm = RMSNorm(tensors[p + "post_attention_norm.weight"], eps)
        self.ffn_norm = RMSNorm(tensors[p + "ffn_norm.weight"], eps)
        self.post_ffn_norm = RMSNorm(tensors[p + "post_ffw_norm.weight"], eps)
        self.mlp = Mlp.from_tensors(p, tensors, backend, packed, args.act)
        self.shape_q = (args.n_heads, args.head_dim)
        self.shape_kv = (args.n_kv_heads, args.head_dim)

    def forward(self, x: Tensor, rot: Rotation, k_cache: Tensor, v_cache: Tensor, l0: int,
                plan: AttnPlan) -> Tensor:  # x: [S, D] -> [S, D]
        s = x.shape[0]
        h = self.attn_norm(x)
        q, k, v = self.qkv(h)                                       # one kernel call when the backend fuses
        q = self.q_norm(q.view(s, *self.shape_q))                   # [S, H, Dh]
        k = self.k_norm(k.view(s, *self.shape_kv))                  # [S, Hkv, Dh]
        v = v.view(s, *self.shape_kv)
        q = apply_rope(q, rot.q_cos, rot.q_sin)                    # rotated and scaled
        write_kv(k_cache, v_cache, l0, apply_rope(k, rot.cos, rot.sin), v)
        x = x + self.post_attn_norm(self.wo(attend(q, k_cache, v_cache, plan)))
        return x + self.post_ffn_norm(self.mlp(self.ffn_norm(x)))


class Gemma3(DecoderBase):
    def __init__(self, args: ModelArgs, tensors: Mapping[str, Tensor], backend: LinearBackend,
                 packed: Mapping[str, Tensor] | None = None):
        super().__init__()
        self.args = args
        self.backend_name = backend.name
        self.invariant = backend.batch_invariant   # row-by-row attention; set False to force batched
        self.embed = tensors["token_embd.weight"]      # [V, D] fp32 rows: a Tensor or an EncodedEmbedding
        self.embed_scale = torch.tensor(args.embed_scale, dtype=torch.float32)  # sqrt(D), fp32 as transformers
        self.layers = nn.ModuleList(Gemma3Block(args, i, tensors, backend, packed) for i in range(args.n_layers))
        self.norm = RMSNorm(tensors["output_norm.weight"], args.norm_eps)
        head_src = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        self.lm_head = make_linear("output.weight", tensors, backend, packed, source=head_src)
        self.rope_global = Rope(args.head_dim, args.rope_theta)
        self.rope_local = Rope(args.head_dim, args.rope_local_theta)
        self.q_scale = default_query_scale(args)

    def _run_layers(self, tokens, positions, cache, l0, tree_mask, slots, hidden, keys) -> Tensor:
        if keys is not None:
            raise ValueError("explicit attention keys (packed sequences) are not supported for models with "
                             "sliding-window layers such as Gemma 3")
        pos = positions.tolist()
        top = max(pos)
        rot_g = Rotation.at(self.rope_global, positions, top, self.q_scale)
        rot_l = Rotation.at(self.rope_local, positions, top, self.q_scale)
        plan_g = plan_attention(l0, pos, positions, tree_mask, 0, self.invariant)
        plan_l = plan_attention(l0, pos, positions, tree_mask, self.args.sliding_window, self.invariant)
        x = self.embed[tokens].float() * self.embed_scale             # [S, D]
        for li, layer in enumerate(self.layers):
            if layer.sliding:
                x = layer(x, rot_l, cache.k[li], cache.v[li], l0, plan_l)
            else:
                x = layer(x, rot_g, cache.k[li], cache.v[li], l0, plan_g)
            for k in slots.get(li, ()):
                hidden[k] = x
        return x
