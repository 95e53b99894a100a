"""Bit-level helpers for the tests of weights: random valid K-quant blocks and bit-for-bit float equality.
Imported by test files (test_bundle.py, test_embedding.py), never a test itself."""

from __future__ import annotations

import gguf
import numpy as np
import torch

T = gguf.GGMLQuantizationType


def random_k_blocks(rng: np.random.Generator, rows: int, cols: int, qtype) -> np.ndarray:
    """Random but valid Q4_K / Q6_K data [rows, bytes]: random codes, small finite fp16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    scales = (rng.standard_normal((raw.shape[0], 2)) * 2e-3).astype(np.float16).view(np.uint8)
    if qtype == T.Q4_K:
        raw[:, 0:4] = scales                    # d, dmin
    else:
        raw[:, -2:] = scales[:, :2]             # Q6_K: d at the end
    return raw.reshape(rows, cols // block * size)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Both fp32 of one shape with the same bits (so -0.0 differs from 0.0 and NaNs compare by payload)."""
    return a.dtype == b.dtype == torch.float32 and a.shape == b.shape and torch.equal(a.view(torch.int32),
                                                                                      b.view(torch.int32))
