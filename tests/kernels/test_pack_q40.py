"""q40 holds a GGUF's Q4_0 tensors in their own 4.5 bits a weight: the values are gguf's own dequantization bit
for bit, the fp32 quantizer is llama.cpp's (the bytes gguf's quantizer writes), and every compiled path (the
scalar reference, AVX2, AVX-512 VNNI here; the Arm paths in test_kernel_paths_driver.py under qemu) computes
bit for bit what the scalar build computes, what the torch twin computes and what the q8b twin (the same
codes with a scale per 16) computes, with each row independent of S = 1 .. 17.
"""

from __future__ import annotations

import pytest
import torch

from legacy_blocks import (assert_kernel_and_twin_on_file_blocks, assert_the_q8b_twin_on_every_row_count,
                           ggufs_quantization, ggufs_values, legacy_blocks)

from speczoo.kernels import native
from speczoo.kernels.backends import get_backend
from speczoo.kernels.pack_q8b import pack_q8b_gguf, unpack_q8b
from speczoo.kernels.pack_q40 import (pack_q40, pack_q40_codes, pack_q40_gguf, q40_from_gguf, quantize_q40,
                                      unpack_q40)
from speczoo.kernels.quantized import Q40Backend
from speczoo.models.loader import dequantize

PATHS = native.runnable_paths()                 # the SIMD paths this CPU runs, then the scalar reference


def test_values_are_ggufs_own_dequantization_bit_for_bit():
    n, k = 24, 768
    raw = legacy_blocks("Q4_0", n, k)
    c = q40_from_gguf(raw, "Q4_0", k)
    want = ggufs_values(raw, "Q4_0")
    assert torch.equal(c.dequantize().view(torch.int32), want.view(torch.int32))
    assert torch.equal(c.dequantize(), dequantize(raw.numpy(), "Q4_0"))                 # speczoo's decoder too
    assert torch.equal(c.q8b().dequantize(), unpack_q8b(pack_q8b_gguf(raw, "Q4_0", k)).dequantize())


def test_the_layout_keeps_the_files_bytes_at_4_5_bits_a_weight():
    n, k = 40, 512                                                   # N ends in a partial strip
    raw = legacy_blocks("Q4_0", n, k, seed=2)
    packed = pack_q40_gguf(raw, "Q4_0", k)
    assert packed["qs"].shape == (3, k // 32, 4, 16, 4) and packed["sd"].shape == (3, k // 32, 16)
    assert packed["qs"].dtype == torch.uint8 and packed["sd"].dtype == torch.float16
    weights = 48 * k                                                 # the padded strip's rows count
    assert (packed["qs"].numel() + 2 * packed["sd"].numel()) * 8 / weights == 4.5
    back = unpack_q40(packed)
    blocks = raw.view(n, k // 32, 18)
    assert torch.equal(back.qs, blocks[:, :, 2:]) and torch.equal(back.d.view(torch.uint8), blocks[:, :, :2].reshape(n, -1))


@pytest.mark.parametrize("k", (32, 96, 768))
def test_the_fp32_quantizer_is_llama_cpps(k):
    w = torch.randn(20, k, generator=torch.Generator().manual_seed(k)) * 0.05
    w[3, :32] = 0.0
    w[4, 5] = -w[4].abs().max() * 2                                  # the largest magnitude negative: d > 0
    c, ref = quantize_q40(w), q40_from_gguf(ggufs_quantization(w, "Q4_0"), "Q4_0", k)
    assert torch.equal(c.qs, ref.qs) and torch.equal(c.d.view(torch.int16), ref.d.view(torch.int16))


def test_a_k_off_the_block_pads_with_zero_codes():
    w = torch.randn(5, 70, generator=torch.Generator().manual_seed(3))
    c = quantize_q40(w)
    assert c.qs.shape == (5, 3, 16) and c.d.shape == (5, 3)
    assert torch.equal(c.dequantize()[:, 70:], torch.zeros(5, 26))
    assert ((c.dequantize()[:, :70] - w).norm() / w.norm()).item() < 0.12


def test_other_types_are_refused_with_the_way_out():
    with pytest.raises(ValueError, match="q8b"):
        q40_from_gguf(torch.zeros(1, 34, dtype=torch.uint8), "Q8_0", 32)
    with pytest.raises(ValueError, match="not 1 rows of 64"):
        q40_from_gguf(torch.zeros(1, 18, dtype=torch.uint8), "Q4_0", 64)


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
@pytest.mark.parametrize("n,k", ((17, 33), (40, 512), (33, 896), (50, 1000)))
def test_every_path_is_the_q8b_twin_bit_for_bit_and_batch_invariant(path, n, k):
    """Each path's q40 output equals the scalar reference's q8b output on the same codes (so the scalar q40
    too: the scalar path is one of PATHS), for every S from 1 to 17 and each row as its 1-row call."""
    g = torch.Generator().manual_seed(n + k)
    c = quantize_q40(torch.randn(n, k, generator=g) * 0.05)
    bias = torch.randn(n, generator=g)
    mod = Q40Backend(path).build(pack_q40_codes(c, n, k), bias)
    assert_the_q8b_twin_on_every_row_count(mod, c, n, k, bias, path.name)


def test_the_torch_twin_and_the_kernel_on_gguf_blocks():
    assert_kernel_and_twin_on_file_blocks("Q4_0", "q40", pack_q40_gguf)


def test_pack_q40_is_the_backends_pack():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(9))
    a, b = pack_q40(w), get_backend("q40").pack(w)
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
