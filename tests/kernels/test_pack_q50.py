"""q50 holds a GGUF's Q5_0 tensors in their own 5.5 bits a weight: the values are gguf's own dequantization bit
for bit, the fp32 quantizer is llama.cpp's (the bytes gguf's quantizer writes), the layout gives each fifth
bit back where the file had it, and every compiled path this CPU runs (the scalar reference among them; the
Arm paths in test_kernel_paths_driver.py under qemu) computes bit for bit what the scalar q8b twin (the same
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
from speczoo.kernels.pack_q50 import (pack_q50, pack_q50_codes, pack_q50_gguf, q50_from_gguf, quantize_q50,
                                      unpack_q50)
from speczoo.kernels.quantized import Q50Backend
from speczoo.models.loader import dequantize

PATHS = native.runnable_paths()                 # the SIMD paths this CPU runs, then the scalar reference


def test_values_are_ggufs_own_dequantization_bit_for_bit():
    n, k = 24, 768
    raw = legacy_blocks("Q5_0", n, k)
    c = q50_from_gguf(raw, "Q5_0", k)
    assert torch.equal(c.dequantize().view(torch.int32), ggufs_values(raw, "Q5_0").view(torch.int32))
    assert torch.equal(c.dequantize(), dequantize(raw.numpy(), "Q5_0"))                 # speczoo's decoder too
    assert torch.equal(c.q8b().dequantize(), unpack_q8b(pack_q8b_gguf(raw, "Q5_0", k)).dequantize())


def test_the_layout_keeps_the_files_bits_at_5_5_bits_a_weight():
    n, k = 40, 512                                                   # N ends in a partial strip
    raw = legacy_blocks("Q5_0", n, k, seed=2)
    packed = pack_q50_gguf(raw, "Q5_0", k)
    g = k // 32
    assert packed["qs"].shape == (3, g, 4, 16, 4) and packed["qh"].shape == (3, g, 16, 4)
    assert packed["sd"].shape == (3, g, 16) and packed["sd"].dtype == torch.float16
    weights = 48 * k                                                 # the padded strip's rows count
    assert (packed["qs"].numel() + packed["qh"].numel() + 2 * packed["sd"].numel()) * 8 / weights == 5.5
    back = unpack_q50(packed)
    blocks = raw.view(n, g, 22)
    assert torch.equal(back.qs, blocks[:, :, 6:]) and torch.equal(back.qh, blocks[:, :, 2:6])
    assert torch.equal(back.d.view(torch.uint8), blocks[:, :, :2].reshape(n, -1))


def test_each_fifth_bit_lands_on_its_quads_lane():
    """Bit j of the kernel's qh byte (g, col, i) is the fifth bit of input 32g + 4j + i: one set bit at a time."""
    for b in (0, 3, 4, 15, 16, 17, 31):
        c = quantize_q50(torch.zeros(1, 32))
        c.qh[0, 0] = torch.tensor([(1 << b) >> (8 * i) & 255 for i in range(4)], dtype=torch.uint8)
        lanes = pack_q50_codes(c, 1, 32)["qh"][0, 0, 0]              # column 0's 4 bytes
        want = torch.zeros(4, dtype=torch.uint8)
        want[b % 4] = 1 << (b // 4)
        assert torch.equal(lanes, want), b


@pytest.mark.parametrize("k", (32, 96, 768))
def test_the_fp32_quantizer_is_llama_cpps(k):
    w = torch.randn(20, k, generator=torch.Generator().manual_seed(k)) * 0.05
    w[3, :32] = 0.0
    w[4, 5] = -w[4].abs().max() * 2                                  # the largest magnitude negative: d > 0
    c, ref = quantize_q50(w), q50_from_gguf(ggufs_quantization(w, "Q5_0"), "Q5_0", k)
    assert torch.equal(c.qs, ref.qs) and torch.equal(c.qh, ref.qh)
    assert torch.equal(c.d.view(torch.int16), ref.d.view(torch.int16))


def test_a_k_off_the_block_pads_with_zero_codes():
    w = torch.randn(5, 70, generator=torch.Generator().manual_seed(3))
    c = quantize_q50(w)
    assert c.qs.shape == (5, 3, 16) and c.qh.shape == (5, 3, 4) and c.d.shape == (5, 3)
    assert torch.equal(c.dequantize()[:, 70:], torch.zeros(5, 26))
    assert ((c.dequantize()[:, :70] - w).norm() / w.norm()).item() < 0.06


def test_other_types_are_refused_with_the_way_out():
    with pytest.raises(ValueError, match="q8b"):
        q50_from_gguf(torch.zeros(1, 34, dtype=torch.uint8), "Q8_0", 32)
    with pytest.raises(ValueError, match="not 1 rows of 64"):
        q50_from_gguf(torch.zeros(1, 22, dtype=torch.uint8), "Q5_0", 64)


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
@pytest.mark.parametrize("n,k", ((17, 33), (40, 512), (33, 896), (50, 1000)))
def test_every_path_is_the_q8b_twin_bit_for_bit_and_batch_invariant(path, n, k):
    g = torch.Generator().manual_seed(n + k)
    c = quantize_q50(torch.randn(n, k, generator=g) * 0.05)
    bias = torch.randn(n, generator=g)
    mod = Q50Backend(path).build(pack_q50_codes(c, n, k), bias)
    assert_the_q8b_twin_on_every_row_count(mod, c, n, k, bias, path.name)


def test_the_torch_twin_and_the_kernel_on_gguf_blocks():
    assert_kernel_and_twin_on_file_blocks("Q5_0", "q50", pack_q50_gguf)


def test_pack_q50_is_the_backends_pack():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(9))
    a, b = pack_q50(w), get_backend("q50").pack(w)
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
