"""Qwen2 (Qwen2.5 / Qwen2.5-Coder) decoder: qkv bias, NEOX RoPE, SiLU gated MLP, RMSNorm.

Tensor names are GGUF's (blk.N.attn_q.weight, ...), weights in torch [out, in] orientation; llama.cpp
does not permute qwen2's q/k, so RoPE rotates halves as transformers does. Every linear goes through
the linear backend; this file never branches on which backend that is.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from speczoo.kernels.block import NativeBlock, NativeStack
from speczoo.kernels.fused import FusedLinears
from speczoo.kernels.linear import LinearBackend
from speczoo.models.args import ModelArgs
from speczoo.models.base import (AttnPlan, DecoderBase, Mlp, RMSNorm, Rope, Rotation, apply_rope, attend,
                                 default_query_scale, make_linear, plan_attention, plan_keys, write_kv)


class Qwen2Block(nn.Module):
    def __init__(self, args: ModelArgs, i: int, tensors: Mapping[str, Tensor], backend: LinearBackend,
                 packed: Mapping[str, Tensor] | None):
        super().__init__()
        p = f"blk.{i}."
        bias = (lambda n: p + n) if args.qkv_bias else (lambda n: None)
        self.attn_norm = RMSNorm(tensors[p + "attn_norm.weight"], args.norm_eps)
        self.qkv = FusedLinears([make_linear(p + "attn_q.weight", tensors, backend, packed, bias("attn_q.bias")),
                                 make_linear(p + "attn_k.weight", tensors, backend, packed, bias("attn_k.bias")),
                                 make_linear(p + "attn_v.weight", tensors, backend, packed, bias("attn_v.bias"))])
        self.wo = make_linear(p + "attn_output.weight", tensors, backend, packed)
        self.ffn_norm = RMSNorm(tensors[p + "ffn_norm.weight"], args.norm_eps)
        self.mlp = Mlp.from_tensors(p, tensors, backend, packed, args.act)
        self.shape_q = (args.n_heads, args.head_dim)
        self.shape_kv = (args.n_kv_heads, args.head_dim)
        # the whole block as one compiled call when every linear is a compiled kernel (else None)
        self.native = NativeBlock.build(self.qkv.runs, self.wo, self.mlp.gate_up.runs, self.mlp.down,
                                        self.attn_norm.weight, self.ffn_norm.weight, args.norm_eps, args.n_heads,
                                        args.n_kv_heads, args.head_dim, args.act)

    def forward(self, x: Tensor, rot: Rotation, k_cache: Tensor, v_cache: Tensor, at: int | Tensor,
                plan: AttnPlan) -> Tensor:  # x: [S, D] -> [S, D]; at: l0, or the rows' cache slots [S]
        if self.native is not None and NativeBlock.supports(x, k_cache, plan.keys, v_cache):
            return self.native(x, rot.cos, rot.sin, rot.q_cos, rot.q_sin, k_cache, v_cache, at, plan.keys)
        s = x.shape[0]
        h = self.attn_norm(x)
        q, k, v = self.qkv(h)                                      # one kernel call when the backend fuses
        q = q.view(s, *self.shape_q)                               # [S, H, Dh]
        k = k.view(s, *self.shape_kv)                              # [S, Hkv, Dh]
        v = v.view(s, *self.shape_kv)
        q = apply_rope(q, rot.q_cos, rot.q_sin)                    # rotated and scaled
        write_kv(k_cache, v_cache, at, apply_rope(k, rot.cos, rot.sin), v)
        x = x + self.wo(attend(q, k_cache, v_cache, plan))
        return x + self.mlp(self.ffn_norm(x))


class Qwen2(DecoderBase):
    def __init__(self, args: ModelArgs, tensors: Mapping[str, Tensor], backend: LinearBackend,
                 packed: Mapping[str, Tensor] | None = None):
        super().__init__()
        self.args = args
        self.backend_name = backend.name
        self.invariant = backend.batch_invariant   # row-by-row attention; set False to force batched
        self.embed = tensors["token_embd.weight"]      # [V, D] fp32 rows: a Tensor or an EncodedEmbedding
        self.layers = nn.ModuleList(Qwen2Block(args, i, tensors, backend, packed) for i in range(args.n_layers))
        self.norm = RMSNorm(tensors["output_norm.weight"], args.norm_eps)
        head_src = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        self.lm_head = make_linear("output.weight", tensors, backend, packed, source=head_src)
        self.rope = Rope(args.head_dim, args.rope_theta)
        self.q_scale = default_query_scale(args)
        self._stack: NativeStack | None = None

    @property
    def stack(self) -> NativeStack | None:
        """Every block in one compiled call when all of them are compiled (else None: block by block);
        rebuilt when a block's compiled forward is swapped (tests run blocks in PyTorch that way)."""
        natives = [layer.native for layer in self.layers]
        if self._stack is None or self._stack.blocks != natives:
            self._stack = NativeStack.build(natives)
        return self._stack

    def _run_layers(self, tokens, positions, cache, at, tree_mask, slots, hidden, keys) -> Tensor:
        pos = positions.tolist()
        rot = Rotation.at(self.rope, positions, max(pos), self.q_scale)
        plan = (plan_keys(keys, self.invariant) if keys is not None
                else plan_attention(at, pos, positions, tree_mask, 0, self.invariant))
        x = self.embed[tokens].float()                                  # [S, D]
        stack = self.stack
        if stack is not None and NativeStack.supports(x, cache.k, cache.v, plan.keys):
            start = 0
            for stop in sorted({li + 1 for li in slots} | {len(self.layers)}):   # runs up to each captured layer
                x = stack.run(x, rot.cos, rot.sin, rot.q_cos, rot.q_sin, cache.k, cache.v, at, plan.keys, start, stop)
                for k in slots.get(stop - 1, ()):
                    hidden[k] = x
                start = stop
            return x
        for li, layer in enumerate(self.layers):
            x = layer(x, rot, cache.k[li], cache.v[li], at, plan)
            for k in slots.get(li, ()):
                hidden[k] = x
        return x
