"""The decoder every architecture file configures: embedding, N blocks, final norm, LM head.

A block is pre-norm attention and a gated MLP, with what the architectures differ in switched by ModelArgs
(qkv bias, per-head q/k norm, sandwich norms, activation, attention soft-capping, sliding-window layers)
and named by the architecture's `Layout` (its GGUF tensor names, separate or fused q/k/v and gate/up).
An architecture is a subclass of `Decoder` in its own file (models/qwen2.py, llama.py, ...) that sets
ARCH, LAYOUT and `args_from_gguf`, and whatever else its file format needs (ROPE_FACTORS, the exact row
order of a source tensor, a builtin chat template); models/registry.py lists them.

A block whose shape the compiled kernel runs (no sandwich norms, SiLU, no soft-capping) and whose linears
are all compiled kernels, of any format and mixed (q4, q6, q8b, q8: what kernels/quantized.py
build_compiled made of the bundle's packing; q|k|v and gate|up as runs of one format), runs as one
compiled call (kernels/block.py), and a model of such blocks with one attention pattern runs all of them
in one call (`NativeStack`); any other block runs in PyTorch with the same linears. This module never branches on the linear backend or on an architecture's
name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from speczoo.kernels.block import NativeBlock, NativeStack
from speczoo.kernels.fused import FusedLinears
from speczoo.kernels.linear import LinearBackend
from speczoo.kernels.quantized import is_compiled
from speczoo.models.args import ModelArgs
from speczoo.models.base import (AttnPlan, DecoderBase, Mlp, RMSNorm, Rope, Rotation, apply_rope, attend,
                                 default_query_scale, make_linear, plan_attention, plan_keys, write_kv)
from speczoo.models.forward import Attend, Packed, Tree
from speczoo.models.meta import GGUFMeta


@dataclass(frozen=True)
class Layout:
    """An architecture's block tensors: their GGUF names after "blk.N.", without ".weight".

    qkv: the q, k and v projections, or one fused [q; k; v] projection (Phi-3's attn_qkv); gate_up likewise
    the gate and up projections, or one fused [gate; up] (Phi-3's ffn_up). A projection's bias is
    "<name>.bias" (read when args.qkv_bias). qk_norm: the per-head norms of q and k (read when
    args.qk_norm); post_norms: the norms after attention and after the MLP (when args.sandwich_norms).
    """

    attn_norm: str
    qkv: tuple[str, ...]
    wo: str
    ffn_norm: str
    gate_up: tuple[str, ...]
    down: str
    qk_norm: tuple[str, str] | None = None
    post_norms: tuple[str, str] | None = None

    def linear_weights(self) -> tuple[str, ...]:
        """The block's linear-layer tensors (what a backend packs)."""
        return (*self.qkv, self.wo, *self.gate_up, self.down)


class SplitLinear(nn.Module):
    """One linear whose output is several side by side (a fused GGUF tensor): returns the column blocks
    of sizes `sizes` as views, like FusedLinears; `fused` is the linear itself, `runs` its one compiled run
    (as FusedLinears.runs: empty when it is not a compiled kernel)."""

    def __init__(self, fused: nn.Module, sizes: list[int]):
        super().__init__()
        self.fused, self.sizes = fused, sizes

    @property
    def runs(self) -> list[nn.Module]:
        return [self.fused] if is_compiled(self.fused) else []

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:  # x: [S, K] -> ([S, sizes[0]], ...)
        return self.fused(x).split(self.sizes, dim=-1)


def _projections(prefix: str, names: tuple[str, ...], sizes: list[int], tensors: Mapping[str, Tensor],
                 backend: LinearBackend, packed: Mapping[str, Tensor] | None, bias: bool) -> nn.Module:
    """Linears of one input giving outputs of `sizes`: one tensor per output (fused at run time when the
    backend can), or one fused tensor whose rows are the outputs in order."""
    mods = [make_linear(f"{prefix}{n}.weight", tensors, backend, packed, f"{prefix}{n}.bias" if bias else None)
            for n in names]
    if len(mods) == len(sizes):
        return FusedLinears(mods)
    if len(mods) == 1:
        return SplitLinear(mods[0], sizes)
    raise ValueError(f"{names} cannot make {len(sizes)} projections: give one tensor per projection or one fused")


class Block(nn.Module):
    def __init__(self, layout: Layout, args: ModelArgs, i: int, tensors: Mapping[str, Tensor],
                 backend: LinearBackend, packed: Mapping[str, Tensor] | None):
        super().__init__()
        p = f"blk.{i}."
        eps = args.norm_eps

        def norm(name: str) -> RMSNorm:
            return RMSNorm(tensors[f"{p}{name}.weight"], eps)

        hd, kvd = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
        self.sliding = args.layer_is_sliding(i)
        self.softcap = args.attn_logit_softcap
        self.attn_norm = norm(layout.attn_norm)
        self.qkv = _projections(p, layout.qkv, [hd, kvd, kvd], tensors, backend, packed, args.qkv_bias)
        self.wo = make_linear(f"{p}{layout.wo}.weight", tensors, backend, packed)
        self.q_norm = self.k_norm = self.post_attn_norm = self.post_ffn_norm = None
        if args.qk_norm:
            self.q_norm, self.k_norm = (norm(n) for n in _named(layout.qk_norm, "q/k norm", args.arch))
        if args.sandwich_norms:
            self.post_attn_norm, self.post_ffn_norm = (norm(n) for n in _named(layout.post_norms, "sandwich norm",
                                                                                args.arch))
        self.ffn_norm = norm(layout.ffn_norm)
        gate_up = _projections(p, layout.gate_up, [args.ffn_dim] * 2, tensors, backend, packed, False)
        self.mlp = Mlp(gate_up, make_linear(f"{p}{layout.down}.weight", tensors, backend, packed), args.act)
        self.shape_q = (args.n_heads, args.head_dim)
        self.shape_kv = (args.n_kv_heads, args.head_dim)
        # the whole block as one compiled call when its shape and every linear allow (else None)
        self.native = None
        if self.post_attn_norm is None and self.softcap == 0:
            self.native = NativeBlock.build(
                self.qkv.runs, self.wo, gate_up.runs, self.mlp.down, self.attn_norm.weight, self.ffn_norm.weight,
                eps, args.n_heads, args.n_kv_heads, args.head_dim, args.act,
                *((self.q_norm.weight, self.k_norm.weight) if self.q_norm is not None else ()))

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
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, rot.q_cos, rot.q_sin)                    # rotated and scaled
        write_kv(k_cache, v_cache, at, apply_rope(k, rot.cos, rot.sin), v)
        a = self.wo(attend(q, k_cache, v_cache, plan, self.softcap))
        x = x + (a if self.post_attn_norm is None else self.post_attn_norm(a))
        m = self.mlp(self.ffn_norm(x))
        return x + (m if self.post_ffn_norm is None else self.post_ffn_norm(m))


def _named(names: tuple[str, str] | None, what: str, arch: str) -> tuple[str, str]:
    if names is None:
        raise ValueError(f"the ModelArgs ask for a {what}, which architecture {arch!r} does not have")
    return names


class Decoder(DecoderBase):
    """A decoder-only model of one architecture; subclasses (one file each) set the class attributes."""

    ARCH: ClassVar[str]                          # the GGUF general.architecture
    LAYOUT: ClassVar[Layout]
    ROPE_FACTORS: ClassVar[str | None] = None    # tensor of per-frequency RoPE divisors, when the file has it
    OUTPUT_NORM: ClassVar[str] = "output_norm"   # the final norm's tensor (LFM2's converter names it token_embd_norm)
    CHAT_TEMPLATE: ClassVar[str | None] = None   # speczoo's builtin template for a file without one

    def __init__(self, args: ModelArgs, tensors: Mapping[str, Tensor], backend: LinearBackend,
                 packed: Mapping[str, Tensor] | None = None):
        super().__init__()
        if args.arch != self.ARCH:
            raise ValueError(f"{type(self).__name__} runs architecture {self.ARCH!r}, not {args.arch!r}")
        self.args = args
        self.backend_name = backend.name
        self.invariant = backend.batch_invariant   # row-by-row attention; set False to force batched
        self.embed = tensors["token_embd.weight"]      # [V, D] fp32 rows: a Tensor or an EncodedEmbedding
        # gemma: the embedding times sqrt(D), an fp32 scalar as transformers has it
        self.embed_scale = torch.tensor(args.embed_scale, dtype=torch.float32) if args.embed_scale != 1.0 else None
        self.layers = nn.ModuleList(self._block(args, i, tensors, backend, packed) for i in range(args.n_layers))
        self.norm = RMSNorm(tensors[f"{self.OUTPUT_NORM}.weight"], args.norm_eps)
        head_src = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        self.lm_head = make_linear("output.weight", tensors, backend, packed, source=head_src)
        factors = tensors.get(self.ROPE_FACTORS) if self.ROPE_FACTORS is not None else None   # [Dh/2] or None
        self.ropes = {sliding: Rope(args.head_dim, args.rope_local_theta if sliding else args.rope_theta,
                                    factors=factors, scale=args.rope_scale, mscale=args.rope_attn_factor,
                                    limit=args.rope_max_positions)
                      for sliding in sorted({layer.sliding for layer in self.layers})}
        self.q_scale = default_query_scale(args)
        self._stack: NativeStack | None = None

    def _block(self, args: ModelArgs, i: int, tensors: Mapping[str, Tensor], backend: LinearBackend,
               packed: Mapping[str, Tensor] | None) -> nn.Module:
        """Layer i: an attention block (a hybrid architecture builds its other layers here)."""
        return Block(self.LAYOUT, args, i, tensors, backend, packed)

    @classmethod
    def args_from_gguf(cls, meta: GGUFMeta) -> ModelArgs:
        """This architecture's ModelArgs from a GGUF's metadata (the file's and llama.cpp's conventions)."""
        raise NotImplementedError

    @classmethod
    def source_rows(cls, name: str, n_rows: int, args: ModelArgs) -> Tensor | None:
        """The row order in which tensor `name` of a GGUF file is what this model reads (int64 [n_rows]:
        model row r is file row order[r]), or None for the file's own order. A row permutation only, so it
        applies exactly to any block type (GGUF blocks never span rows)."""
        return None

    @classmethod
    def linear_weights(cls) -> tuple[str, ...]:
        return cls.LAYOUT.linear_weights()

    @property
    def stack(self) -> NativeStack | None:
        """Every block in one compiled call when all of them are compiled (else None: block by block);
        rebuilt when a block's compiled forward is swapped (tests run blocks in PyTorch that way)."""
        natives = [layer.native for layer in self.layers]
        if self._stack is None or self._stack.blocks != natives:
            self._stack = NativeStack.build(natives)
        return self._stack

    def _attention(self, positions: Tensor, at: int | Tensor, attend: Attend) -> tuple[dict, dict]:
        """This forward's RoPE rotation and key plan of each kind of attention layer (by `sliding`)."""
        if isinstance(attend, Packed) and True in self.ropes:
            raise ValueError("explicit attention keys (packed sequences) are not supported for models with "
                             f"sliding-window layers ({self.ARCH})")
        pos = positions.tolist()
        top = max(pos)
        tree_mask = attend.mask if isinstance(attend, Tree) else None       # [S, S] bool, or None for a chain
        rots, plans = {}, {}
        for sliding, rope in self.ropes.items():
            rots[sliding] = Rotation.at(rope, positions, top, self.q_scale)
            if isinstance(attend, Packed):
                plans[sliding] = plan_keys(attend.keys, self.invariant)
            else:
                plans[sliding] = plan_attention(at, pos, positions, tree_mask,
                                                self.args.sliding_window if sliding else 0, self.invariant)
        return rots, plans

    def _embed(self, tokens: Tensor) -> Tensor:
        x = self.embed[tokens].float()                                  # [S, D]
        return x if self.embed_scale is None else x * self.embed_scale

    def _run_layers(self, tokens, positions, cache, at, attend: Attend, slots, hidden) -> Tensor:
        rots, plans = self._attention(positions, at, attend)
        x = self._embed(tokens)
        stack = self.stack
        if stack is not None and len(self.ropes) == 1:
            (rot,), (plan,) = rots.values(), plans.values()
            if NativeStack.supports(x, cache.k, cache.v, plan.keys):
                start = 0
                for stop in sorted({li + 1 for li in slots} | {len(self.layers)}):   # up to each captured layer
                    x = stack.run(x, rot.cos, rot.sin, rot.q_cos, rot.q_sin, cache.k, cache.v, at, plan.keys,
                                  start, stop)
                    for k in slots.get(stop - 1, ()):
                        hidden[k] = x
                    start = stop
                return x
        for li, layer in enumerate(self.layers):
            x = layer(x, rots[layer.sliding], cache.k[li], cache.v[li], at, plans[layer.sliding])
            for k in slots.get(li, ()):
                hidden[k] = x
        return x
