"""Tiny random models of each architecture for fast tests (no download), and a batch-invariant fp32
linear backend ("fp32-rows", F.linear one row at a time) registered for tests.

    from tiny import tiny_model
    model, args = tiny_model("qwen2", backend="fp32-rows", seed=0)

Weights use GGUF tensor names and torch [out, in] orientation, exactly as a bundle stores them, so the
models are built through the real loader path (`build_model`). Dims keep H * Dh a multiple of 16 so that
every query row starts 64-byte aligned, as in the real models.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speczoo.kernels import backends, linear
from speczoo.models.args import ModelArgs
from speczoo.models.loader import build_model


class RowwiseLinear(nn.Module):
    """fp32 F.linear applied to each row alone: trivially batch-invariant (slow; tests only)."""

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] -> [S, N]
        return torch.cat([F.linear(x[i:i + 1], self.weight, self.bias) for i in range(x.shape[0])])


class RowwiseBackend(linear.LinearBackend):
    name = "fp32-rows"
    stored = False
    batch_invariant = True

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return {"weight": weight.float()}

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return RowwiseLinear(packed["weight"], bias)


if RowwiseBackend.name not in backends.BACKENDS:
    backends.register(RowwiseBackend())

TINY_ARGS = {
    "qwen2": dict(arch="qwen2", vocab_size=128, dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16,
                  ffn_dim=96, norm_eps=1e-6, rope_theta=10_000.0, qkv_bias=True, act="silu",
                  tie_embeddings=True),
    "gemma3": dict(arch="gemma3", vocab_size=128, dim=48, n_layers=4, n_heads=4, n_kv_heads=1, head_dim=32,
                   ffn_dim=96, norm_eps=1e-6, rope_theta=1_000_000.0, rope_local_theta=10_000.0,
                   sliding_window=6, sliding_pattern=2, qk_norm=True, sandwich_norms=True, act="gelu_tanh",
                   embed_scale=math.sqrt(48), tie_embeddings=True),
}


def tiny_tensors(args: ModelArgs, seed: int = 0, tied: bool = True) -> dict[str, Tensor]:
    """Random weights under GGUF names for `args` (torch [out, in] orientation)."""
    g = torch.Generator().manual_seed(seed)

    def lin(n_out: int, n_in: int) -> Tensor:
        return torch.randn(n_out, n_in, generator=g) / math.sqrt(n_in)

    def norm(n: int) -> Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    d, hd = args.dim, args.head_dim
    t: dict[str, Tensor] = {"token_embd.weight": torch.randn(args.vocab_size, d, generator=g) * 0.5,
                            "output_norm.weight": norm(d)}
    if not tied:
        t["output.weight"] = lin(args.vocab_size, d)
    for i in range(args.n_layers):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(d)
        t[p + "attn_q.weight"] = lin(args.n_heads * hd, d)
        t[p + "attn_k.weight"] = lin(args.n_kv_heads * hd, d)
        t[p + "attn_v.weight"] = lin(args.n_kv_heads * hd, d)
        t[p + "attn_output.weight"] = lin(d, args.n_heads * hd)
        t[p + "ffn_norm.weight"] = norm(d)
        t[p + "ffn_gate.weight"] = lin(args.ffn_dim, d)
        t[p + "ffn_up.weight"] = lin(args.ffn_dim, d)
        t[p + "ffn_down.weight"] = lin(d, args.ffn_dim)
        if args.qkv_bias:
            t[p + "attn_q.bias"] = 0.1 * torch.randn(args.n_heads * hd, generator=g)
            t[p + "attn_k.bias"] = 0.1 * torch.randn(args.n_kv_heads * hd, generator=g)
            t[p + "attn_v.bias"] = 0.1 * torch.randn(args.n_kv_heads * hd, generator=g)
        if args.qk_norm:
            t[p + "attn_q_norm.weight"] = norm(hd)
            t[p + "attn_k_norm.weight"] = norm(hd)
        if args.sandwich_norms:
            t[p + "post_attention_norm.weight"] = norm(d)
            t[p + "post_ffw_norm.weight"] = norm(d)
    return t


def tiny_args(arch: str, vocab: int | None = None, **overrides) -> ModelArgs:
    kw = dict(TINY_ARGS[arch])
    if vocab is not None:
        kw["vocab_size"] = vocab
    kw.update(overrides)
    return ModelArgs(**kw)


def tiny_model(arch: str, backend: str = "fp32", seed: int = 0, vocab: int | None = None, **overrides):
    """(model, args): a tiny random `arch` model built with linear backend `backend`.

    overrides are ModelArgs fields (e.g. n_layers=2, sliding_window=4); tie_embeddings=False adds a
    separate output.weight.
    """
    args = tiny_args(arch, vocab, **overrides)
    tensors = tiny_tensors(args, seed, tied=args.tie_embeddings)
    return build_model(args, tensors, backend), args


def tree_mask(parents: list[int]) -> Tensor:
    """[S, S] bool: row i sees itself and its ancestors (parents[i] = -1 for a root)."""
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i in range(len(parents)):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask
