"""Shared by the tests of the formats that hold llama.cpp's legacy types in their own bits (q40, q50, q80):
blocks of a type as a file holds them, activations with outliers, and the check that a format's kernel is
its q8b twin bit for bit on every row count."""

from __future__ import annotations

import gguf
import numpy as np
import torch

from speczoo.kernels import native
from speczoo.kernels.backends import get_backend
from speczoo.kernels.pack_q8b import pack_q8b_codes
from speczoo.kernels.quantized import Q8bBackend
from speczoo.models.loader import dequantize

BLOCK_BYTES = {"Q4_0": 18, "Q5_0": 22, "Q8_0": 34}      # a block of 32 inputs: fp16 d first


def legacy_blocks(kind: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Data uint8 [N, K / 32 * bytes] of `kind` as a file holds it: gguf's quantizer over Gaussian weights, an
    all-zero block, and scales that are negative, subnormal, zero and the largest fp16."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    w[0, :32] = 0.0
    qtype = gguf.GGMLQuantizationType[kind]
    raw = torch.from_numpy(np.ascontiguousarray(gguf.quants.quantize(w, qtype)).view(np.uint8)).clone()
    blocks = raw.view(n, k // 32, BLOCK_BYTES[kind])
    special = torch.tensor([-0.01, 6e-8, 0.0, 65504.0, -3e-5], dtype=torch.float16).view(torch.uint8).view(-1, 2)
    blocks[1, : special.shape[0], :2] = special
    return raw


def ggufs_values(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """gguf's own dequantization of `raw`, fp32 [N, K]."""
    return torch.from_numpy(np.array(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[kind]),
                                     dtype=np.float32))


def ggufs_quantization(w: torch.Tensor, kind: str) -> torch.Tensor:
    """The bytes gguf's quantizer (llama.cpp's reference one) writes for fp32 w [N, K]."""
    qtype = gguf.GGMLQuantizationType[kind]
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.quantize(w.numpy(), qtype)).view(np.uint8))


def acts(s: int, k: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(s, k, generator=g)
    x[:, : max(1, k // 50)] *= 20.0
    return x


def assert_the_q8b_twin_on_every_row_count(mod: torch.nn.Module, codes, n: int, k: int, bias: torch.Tensor,
                                           who: str) -> None:
    """mod's output equals the scalar reference's q8b output on the same codes (codes.q8b()) for every S from
    1 to 17, and each row equals its 1-row call."""
    twin = Q8bBackend(native.scalar_path()).build(pack_q8b_codes(codes.q8b(), n, k), bias)
    x = acts(17, k)
    ref = twin(x)
    assert torch.equal(mod(x), ref), who
    for s in range(1, 18):
        assert torch.equal(mod(x[:s]), ref[:s]), f"{who} S={s}"
    for i in range(17):
        assert torch.equal(mod(x[i:i + 1])[0], ref[i]), f"{who} row {i} alone"


def assert_kernel_and_twin_on_file_blocks(kind: str, fmt: str, pack_gguf) -> None:
    """On blocks as a file holds them (zero scales among them), the format's kernel equals its torch twin bit
    for bit and gguf's own values times x within the activations' int8 rounding."""
    n, k = 24, 768
    raw = legacy_blocks(kind, n, k, seed=5)
    raw.view(n, k // 32, BLOCK_BYTES[kind])[1, :5, :2] = 0           # scales a real file has (the 65504 aside)
    packed = pack_gguf(raw, kind, k)
    x = acts(9, k)
    y = get_backend(fmt).build(packed, None)(x)
    assert torch.equal(y, get_backend(f"{fmt}_torch").build(packed, None)(x))
    ref = x @ dequantize(raw.numpy(), kind).t()
    assert ((y - ref).norm() / ref.norm()).item() < 0.01
