"""q8b holds a GGUF's Q8_0 / Q6_K / Q5_0 / Q4_0 tensors exactly and q6 its Q6_K ones in their own bytes; a q6
weight computes exactly what its q8b twin computes; both fuse and split by strips like the other formats.
(Batch invariance, the torch twins and parity with fp32: test_kernels.py.)"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from speczoo.kernels.backends import get_backend
from speczoo.kernels.fused import FusedLinears
from speczoo.kernels.pack_q6 import pack_q6, pack_q6_gguf, q6_from_gguf, quantize_q6, unpack_q6
from speczoo.kernels.pack_q8b import (Q8B_GGUF_TYPES, pack_q8b, pack_q8b_gguf, q8b_from_gguf, quantize_q8b,
                                      unpack_q8b)
from speczoo.kernels.quantized import select_strips
from speczoo.models.loader import dequantize


def _gguf_blocks(encoding: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """GGUF data uint8 [N, bytes per row] of `encoding`: gguf's own quantizer where it has one, else (Q6_K)
    random blocks with a finite fp16 scale (every byte pattern of the codes and sub-scales is valid)."""
    rng = np.random.default_rng(seed)
    if encoding != "Q6_K":
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        w[0, :32] = 0.0                                      # an all-zero block
        return torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType[encoding]))
    raw = torch.from_numpy(rng.integers(0, 256, (n, k // 256 * 210), dtype=np.uint8))
    blocks = raw.view(-1, 210)
    d = torch.from_numpy((rng.random(blocks.shape[0]) * 1e-3 + 1e-4).astype(np.float16))
    blocks[:, 208:210] = d.view(torch.uint8).view(-1, 2)
    return raw


@pytest.mark.parametrize("encoding", Q8B_GGUF_TYPES)
def test_gguf_types_convert_exactly(encoding):
    n, k = 24, 768
    raw = _gguf_blocks(encoding, n, k)
    codes = q8b_from_gguf(raw, encoding, k)
    assert torch.equal(codes.dequantize(), dequantize(raw.numpy(), encoding))        # gguf's own values, bit for bit
    back = unpack_q8b(pack_q8b_gguf(raw, encoding, k))
    assert torch.equal(back.q, codes.q) and torch.equal(back.a, codes.a)


@pytest.mark.parametrize("encoding", Q8B_GGUF_TYPES)
def test_kernel_on_converted_weights_matches_fp32(encoding):
    n, k = 40, 512
    raw = _gguf_blocks(encoding, n, k)
    w = dequantize(raw.numpy(), encoding)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(2))
    y = get_backend("q8b").build(pack_q8b_gguf(raw, encoding, k), None)(x)
    ref = x @ w.t()
    assert ((y - ref).norm() / ref.norm()).item() < 0.01     # the activations' int8 rounding only


def test_other_types_are_refused_with_the_way_out():
    with pytest.raises(ValueError, match="pack_q8b"):
        q8b_from_gguf(torch.zeros(1, 144, dtype=torch.uint8), "Q4_K", 256)
    with pytest.raises(ValueError, match="not 2 rows of 64"):
        q8b_from_gguf(torch.zeros(2, 35, dtype=torch.uint8), "Q8_0", 64)


def test_fp32_quantizer_codes_and_scales():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(5, 70, generator=g)
    w[1, 16:32] = 0.0
    c = quantize_q8b(w)
    assert c.q.shape == (5, 96) and c.a.shape == (5, 6)                  # K padded to 32
    assert int(c.q.abs().max()) == 127 and c.a[1, 1] == 0 and not c.q[1, 16:32].any()
    assert ((c.dequantize()[:, :70] - w).abs() <= c.a.repeat_interleave(16, 1)[:, :70] / 2 + 1e-7).all()


def test_q6_holds_q6_k_exactly_and_computes_its_q8b_twin():
    n, k = 40, 768
    raw = _gguf_blocks("Q6_K", n, k)
    codes = q6_from_gguf(raw, "Q6_K", k)
    assert torch.equal(codes.dequantize(), dequantize(raw.numpy(), "Q6_K"))
    back = unpack_q6(pack_q6_gguf(raw, "Q6_K", k))
    assert all(torch.equal(getattr(back, f), getattr(codes, f)) for f in ("u", "sc", "d"))
    q6 = get_backend("q6").build(pack_q6_gguf(raw, "Q6_K", k), torch.ones(n))
    q8b = get_backend("q8b").build(pack_q8b_gguf(raw, "Q6_K", k), torch.ones(n))
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(3))
    assert torch.equal(q6(x), q8b(x))                        # the same codes and scales, the same arithmetic
    bytes_ = sum(t.numel() * t.element_size() for t in (q6.ql, q6.qh, q6.sc, q6.dd))
    assert bytes_ * 8 / (48 * k) == 6.625                    # N padded to 3 strips: Q6_K's 6.56 bits, q8b's 10
    with pytest.raises(ValueError, match="q8b"):
        q6_from_gguf(raw, "Q8_0", k)


def test_q6_fp32_quantizer_grid():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(6, 300, generator=g)
    w[2] = 0.0
    c = quantize_q6(w)
    assert c.u.shape == (6, 320) and c.sc.shape == (6, 20) and c.d.shape == (6, 2)
    assert int(c.u.max()) <= 63 and not (c.u[2] != 32).any() and not c.sc[2].any()
    assert ((c.dequantize()[:, :300] - w).norm() / w.norm()).item() < 0.03


@pytest.mark.parametrize("fmt", ["q8b", "q6"])
def test_fused_and_strip_selected_modules_compute_the_same_columns(fmt):
    g = torch.Generator().manual_seed(6)
    w1, w2 = torch.randn(32, 96, generator=g), torch.randn(48, 96, generator=g)
    b1, b2 = torch.randn(32, generator=g), torch.randn(48, generator=g)
    be, pack = get_backend(fmt), {"q8b": pack_q8b, "q6": pack_q6}[fmt]
    m1, m2 = be.build(pack(w1), b1), be.build(pack(w2), b2)
    fused = FusedLinears([m1, m2])
    assert fused.fused is not None
    x = torch.randn(3, 96, generator=g)
    y1, y2 = fused(x)
    assert torch.equal(y1, m1(x)) and torch.equal(y2, m2(x))
    part = select_strips(m2, torch.tensor([2, 0]))
    full = m2(x)
    assert torch.equal(part(x), torch.cat([full[:, 32:48], full[:, 0:16]], dim=1))


def test_a_packing_builds_the_module_of_its_own_format():
    from speczoo.kernels import native
    from speczoo.kernels.quantized import Q4Native, Q6Native, Q8bNative, Q8Native, build_compiled

    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(8))
    lib = native.kernels()
    for fmt, cls in (("q4", Q4Native), ("q6", Q6Native), ("q8b", Q8bNative), ("q8", Q8Native)):
        assert type(build_compiled(get_backend(fmt).pack(w), None, lib)) is cls
    with pytest.raises(ValueError, match="re-pull"):
        build_compiled({"weight": w, "meta": torch.tensor([16, 64])}, None, lib)
