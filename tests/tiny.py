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
from speczoo.models.registry import arch_class


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
    "llama": dict(arch="llama", vocab_size=128, dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16,
                  ffn_dim=96, norm_eps=1e-5, rope_theta=10_000.0, act="silu", tie_embeddings=True),
    # head_dim wider than dim / n_heads, as the small Qwen3 models have it
    "qwen3": dict(arch="qwen3", vocab_size=128, dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32,
                  ffn_dim=96, norm_eps=1e-6, rope_theta=1_000_000.0, qk_norm=True, act="silu", tie_embeddings=True),
    "phi3": dict(arch="phi3", vocab_size=128, dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16,
                 ffn_dim=96, norm_eps=1e-5, rope_theta=10_000.0, rope_local_theta=10_000.0, act="silu",
                 tie_embeddings=True),
    # soft-caps small enough that the tanh bends the tiny model's scores and logits
    "gemma2": dict(arch="gemma2", vocab_size=128, dim=48, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32,
                   ffn_dim=96, norm_eps=1e-6, rope_theta=10_000.0, rope_local_theta=10_000.0,
                   sliding_window=6, sliding_pattern=2, sandwich_norms=True, act="gelu_tanh",
                   embed_scale=math.sqrt(48), query_scale=1.0 / math.sqrt(32), attn_logit_softcap=2.0,
                   final_logit_softcap=5.0, tie_embeddings=True),
    # a hybrid: short-convolution layers 0 and 2 (no K/V), attention layers 1 and 3 (Qwen3's, with q/k norms)
    "lfm2": dict(arch="lfm2", vocab_size=128, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                 ffn_dim=96, norm_eps=1e-5, rope_theta=1_000_000.0, qk_norm=True, act="silu", tie_embeddings=True,
                 conv_layers=[0, 2], conv_kernel=3),
}
ARCHS = list(TINY_ARGS)           # every architecture, for tests parametrized over them


def tiny_tensors(args: ModelArgs, seed: int = 0, tied: bool = True, rope_factors: bool = False) -> dict[str, Tensor]:
    """Random weights under GGUF names for `args` (torch [out, in] orientation), named by its architecture's
    layout (fused q/k/v and gate/up for phi3). rope_factors: add the architecture's RoPE frequency
    divisors (llama: rope_freqs; phi3: LongRoPE's short and long factors), in [1, 4)."""
    g = torch.Generator().manual_seed(seed)
    layout = arch_class(args.arch).LAYOUT

    def lin(n_out: int, n_in: int) -> Tensor:
        return torch.randn(n_out, n_in, generator=g) / math.sqrt(n_in)

    def norm(n: int) -> Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    d, hd = args.dim, args.head_dim
    qkv_rows = [args.n_heads * hd, args.n_kv_heads * hd, args.n_kv_heads * hd]
    t: dict[str, Tensor] = {"token_embd.weight": torch.randn(args.vocab_size, d, generator=g) * 0.5,
                            f"{arch_class(args.arch).OUTPUT_NORM}.weight": norm(d)}
    if not tied:
        t["output.weight"] = lin(args.vocab_size, d)
    if rope_factors:
        names = {"llama": ["rope_freqs.weight"], "phi3": ["rope_factors_short.weight", "rope_factors_long.weight"]}
        for name in names[args.arch]:
            t[name] = 1.0 + 3.0 * torch.rand(hd // 2, generator=g)
    for i in range(args.n_layers):
        p = f"blk.{i}."
        t[p + layout.attn_norm + ".weight"] = norm(d)
        if i in args.conv_layers:                      # a short convolution in place of attention
            t[p + "shortconv.in_proj.weight"] = lin(3 * d, d)
            t[p + "shortconv.conv.weight"] = torch.randn(d, args.conv_kernel, generator=g) / math.sqrt(args.conv_kernel)
            t[p + "shortconv.out_proj.weight"] = lin(d, d)
            t[p + layout.ffn_norm + ".weight"] = norm(d)
            for name in layout.gate_up:
                t[p + name + ".weight"] = lin(args.ffn_dim, d)
            t[p + layout.down + ".weight"] = lin(d, args.ffn_dim)
            continue
        qkv = list(zip(layout.qkv, qkv_rows if len(layout.qkv) == 3 else [sum(qkv_rows)], strict=True))
        for name, n in qkv:
            t[p + name + ".weight"] = lin(n, d)
        t[p + layout.wo + ".weight"] = lin(d, args.n_heads * hd)
        t[p + layout.ffn_norm + ".weight"] = norm(d)
        for name in layout.gate_up:
            t[p + name + ".weight"] = lin(args.ffn_dim * (3 - len(layout.gate_up)), d)
        t[p + layout.down + ".weight"] = lin(d, args.ffn_dim)
        if args.qkv_bias:
            for name, n in qkv:
                t[p + name + ".bias"] = 0.1 * torch.randn(n, generator=g)
        if args.qk_norm:
            for name in layout.qk_norm:
                t[p + name + ".weight"] = norm(hd)
        if args.sandwich_norms:
            for name in layout.post_norms:
                t[p + name + ".weight"] = norm(d)
    return t


def tiny_args(arch: str, vocab: int | None = None, **overrides) -> ModelArgs:
    kw = dict(TINY_ARGS[arch])
    if vocab is not None:
        kw["vocab_size"] = vocab
    kw.update(overrides)
    if "conv_layers" in kw:                            # a hybrid cut to fewer layers keeps those it still has
        kw["conv_layers"] = [i for i in kw["conv_layers"] if i < kw["n_layers"]]
    return ModelArgs(**kw)


def tiny_model(arch: str, backend: str = "fp32", seed: int = 0, vocab: int | None = None,
               rope_factors: bool = False, **overrides):
    """(model, args): a tiny random `arch` model built with linear backend `backend`.

    overrides are ModelArgs fields (e.g. n_layers=2, sliding_window=4); tie_embeddings=False adds a
    separate output.weight; rope_factors: see tiny_tensors.
    """
    args = tiny_args(arch, vocab, **overrides)
    tensors = tiny_tensors(args, seed, tied=args.tie_embeddings, rope_factors=rope_factors)
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


def greedy(model, args: ModelArgs, prompt: Tensor, n: int) -> list[int]:
    """The model's greedy continuation of `prompt` [S] (int64), n tokens: a prefill, then one decode step
    per token through the KV cache."""
    from speczoo.cache import KVCache

    c = KVCache(args, len(prompt) + n + 8)
    logits = model(prompt, torch.arange(len(prompt)), c).logits[-1]
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = model(torch.tensor(out[-1:]), torch.tensor([c.length]), c).logits[-1]
    return out

