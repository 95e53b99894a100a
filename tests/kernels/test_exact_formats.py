"""q8b holds a GGUF's Q8_0 / Q6_K / Q5_0 / Q4_0 tensors exactly, q8bm its Q4_1 / Q5_1 ones (offsets included)
and q6 its Q6_K ones in their own bytes; a q6
weight computes exactly what its q8b twin computes; f32, f16 and bf16 hold a GGUF's F32, F16 and BF16 tensors
bit for bit (their very bytes) and compute each output within fp32 rounding of the float64 product; all of
them fuse and split by strips like the other formats. (Batch invariance, the torch twins and parity with
fp32: test_kernels.py; every path's bits: test_kernel_paths.py.)"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from speczoo.kernels.backends import get_backend
from speczoo.kernels.fused import FusedLinears
from speczoo.kernels.pack_float import FLOAT_KALIGN, float_part, float_values, pack_float, unpack_float
from speczoo.kernels.pack_q6 import pack_q6, pack_q6_gguf, q6_from_gguf, quantize_q6, unpack_q6
from speczoo.kernels.pack_q8b import (Q8B_GGUF_TYPES, Q8BM_GGUF_TYPES, pack_q8b, pack_q8b_gguf, q8b_from_gguf,
                                      quantize_q8b, quantize_q8bm, unpack_q8b)
from speczoo.kernels.quantized import MixedBackend, select_strips
from speczoo.models.loader import dequantize
from speczoo.zoo.policy import POLICY, pack_tensor


def _gguf_blocks(encoding: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """GGUF data uint8 [N, bytes per row] of `encoding`: gguf's own quantizer where it has one, else (Q6_K)
    random blocks with a finite fp16 scale (every byte pattern of the codes and sub-scales is valid)."""
    rng = np.random.default_rng(seed)
    if encoding != "Q6_K":
        w = (rng.standard_normal((n, k)) * 0.05 + 0.01).astype(np.float32)   # off centre: Q4_1's m is not -8 d
        w[0, :32] = 0.0                                      # an all-zero block
        return torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType[encoding]))
    raw = torch.from_numpy(rng.integers(0, 256, (n, k // 256 * 210), dtype=np.uint8))
    blocks = raw.view(-1, 210)
    d = torch.from_numpy((rng.random(blocks.shape[0]) * 1e-3 + 1e-4).astype(np.float16))
    blocks[:, 208:210] = d.view(torch.uint8).view(-1, 2)
    return raw


@pytest.mark.parametrize("encoding", Q8B_GGUF_TYPES + Q8BM_GGUF_TYPES)
def test_gguf_types_convert_exactly(encoding):
    n, k = 24, 768
    raw = _gguf_blocks(encoding, n, k)
    codes = q8b_from_gguf(raw, encoding, k)
    assert torch.equal(codes.dequantize(), dequantize(raw.numpy(), encoding))        # gguf's own values, bit for bit
    assert (codes.m is not None) == (encoding in Q8BM_GGUF_TYPES)
    packed = pack_q8b_gguf(raw, encoding, k)
    assert ("mb" in packed) == (encoding in Q8BM_GGUF_TYPES) and POLICY[encoding].exact
    back = unpack_q8b(packed)
    assert torch.equal(back.q, codes.q) and torch.equal(back.a, codes.a)
    assert codes.m is None or torch.equal(back.m, codes.m)


@pytest.mark.parametrize("encoding", Q8B_GGUF_TYPES + Q8BM_GGUF_TYPES)
def test_kernel_on_converted_weights_matches_fp32(encoding):
    n, k = 40, 512
    raw = _gguf_blocks(encoding, n, k)
    w = dequantize(raw.numpy(), encoding)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(2))
    y = get_backend("q8b" if encoding in Q8B_GGUF_TYPES else "q8bm").build(pack_q8b_gguf(raw, encoding, k), None)(x)
    ref = x @ w.t()
    assert ((y - ref).norm() / ref.norm()).item() < 0.01     # the activations' int8 rounding only


def test_q8bm_quantizer_centres_each_group():
    """An fp32 weight in q8bm (a weight packed in memory): the offset of each 32 is the middle of its range,
    the codes q8b's of what is left; its padding past K computes nothing (zero activations there)."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(6, 100, generator=g) * 0.05 + torch.linspace(-0.2, 0.2, 6)[:, None]
    c = quantize_q8bm(w)
    assert c.q.shape == (6, 128) and c.a.shape == (6, 8) and c.m.shape == (6, 4)
    grp = w[:, :96].reshape(6, 3, 32)
    assert torch.equal(c.m[:, :3], (grp.amax(-1) + grp.amin(-1)) * 0.5)
    assert ((c.dequantize()[:, :100] - w).norm() / w.norm()).item() < 0.004       # q8b's grid on half the range


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


@pytest.mark.parametrize("fmt", ["q8b", "q8bm", "q40", "q50", "q80", "q6", "f32", "f16", "bf16w"])
def test_fused_and_strip_selected_modules_compute_the_same_columns(fmt):
    g = torch.Generator().manual_seed(6)
    w1, w2 = torch.randn(32, 96, generator=g), torch.randn(48, 96, generator=g)
    b1, b2 = torch.randn(32, generator=g), torch.randn(48, generator=g)
    be = get_backend(fmt)
    pack = be.pack
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
    from speczoo.kernels.quantized import (Bf16Native, F16Native, F32Native, Q4Native, Q6Native, Q8bmNative,
                                           Q8bNative, Q8Native, Q40Native, Q50Native, Q80Native, build_compiled)

    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(8))
    lib = native.kernels()
    for fmt, cls in (("q4", Q4Native), ("q6", Q6Native), ("q8b", Q8bNative), ("q8bm", Q8bmNative), ("q8", Q8Native),
                     ("q40", Q40Native), ("q50", Q50Native), ("q80", Q80Native), ("f32", F32Native),
                     ("f16", F16Native), ("bf16w", Bf16Native)):
        assert type(build_compiled(get_backend(fmt).pack(w), None, lib)) is cls
    with pytest.raises(ValueError, match="re-pull"):
        build_compiled({"weight": w, "meta": torch.tensor([16, 64])}, None, lib)


# ---------------------------------------------------------------- the float formats
FLOAT_TYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


def _float_gguf(kind: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """GGUF data uint8 [N, bytes per row] of F32 / F16 / BF16 as a file stores it: Gaussian weights with
    subnormals of the type, an all-zero row, and (F16) values up to its largest, 65504."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[1] = 0.0
    if kind == "F32":
        w[2, ::5] = 1e-42                                              # fp32 subnormals
        return w.view(torch.uint8).view(n, 4 * k)
    if kind == "F16":
        h = w.half()
        h[2, ::5] = 2.0 ** -24                                         # the smallest fp16 subnormal
        h[3, :4] = torch.tensor([65504.0, -65504.0, 6.1e-5, -3.0e-5])
        return h.view(torch.uint8).view(n, 2 * k)
    b = (w.view(torch.int32) >> 16).to(torch.int16)                    # bf16: the top half of each fp32
    b[2, ::5] = 3                                                      # bf16 subnormals (3 * 2^-133)
    return b.view(torch.uint8).view(n, 2 * k)


@pytest.mark.parametrize("kind", sorted(FLOAT_TYPES))
def test_float_formats_hold_their_gguf_types_bit_for_bit(kind):
    n, k = 40, 300
    raw = _float_gguf(kind, n, k)
    values = dequantize(raw, kind)                                     # gguf's fp32 values [N, K]
    fmt = FLOAT_TYPES[kind]
    packed = pack_float(values, fmt)
    assert torch.equal(unpack_float(packed).view(torch.int32), values.view(torch.int32))
    chunks = packed[float_part(fmt)]                                  # [NB, 4, KP/16, 4, 16]
    assert chunks.shape == (3, 4, 19, 4, 16)
    plain = chunks.permute(0, 1, 3, 2, 4).reshape(48, 304)            # [NB * 16, KP]
    assert not plain[n:].any() and not plain[:, k:].any()              # zero padding
    assert torch.equal(float_values(packed).contiguous().view(torch.uint8).view(n, -1), raw)   # the file's own bytes
    # the pull: the policy's exact row, measured error 0, the same bytes
    assert POLICY[kind].format == fmt and POLICY[kind].exact
    pt = pack_tensor(kind, values if kind == "F32" else raw, MixedBackend())   # the pull reads F32 as fp32
    assert pt.format == fmt and pt.error.err2 == 0.0 and torch.equal(pt.parts[float_part(fmt)], packed[float_part(fmt)])


@pytest.mark.parametrize("kind", sorted(FLOAT_TYPES))
@pytest.mark.parametrize("n,k", ((40, 300), (24, 896), (17, 1536)))
def test_float_kernels_are_within_fp32_rounding_of_float64(kind, n, k):
    """Each output is a chain of KP/16 fused multiply-adds per lane, a 4-level tree and the bias add, so its
    error is at most gamma_m * (sum |x_k w_k| + |b|) with m = KP/16 + 5 roundings (Higham's bound)."""
    raw = _float_gguf(kind, n, k, seed=k)
    w = dequantize(raw, kind)                                          # [N, K] exact
    g = torch.Generator().manual_seed(n)
    b = torch.randn(n, generator=g)
    x = torch.randn(9, k, generator=g)
    x[:, : k // 50] *= 20.0
    mod = get_backend(FLOAT_TYPES[kind] if kind != "BF16" else "bf16w").build(pack_float(w, FLOAT_TYPES[kind]), b)
    y = mod(x).double()
    ref = x.double() @ w.double().t() + b.double()
    m = -(-k // FLOAT_KALIGN) + 5
    u = 2.0 ** -24
    bound = (m * u / (1 - m * u)) * (x.double().abs() @ w.double().abs().t() + b.double().abs())
    assert ((y - ref).abs() <= bound).all(), float(((y - ref).abs() / bound).max())
    assert float((y - ref).abs().max()) > 0                            # a real fp32 computation, not float64


def test_float_packing_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="beyond f16's range"):
        pack_float(torch.tensor([[1.0, 7.0e4]]), "f16")
    with pytest.raises(ValueError, match="NaN or inf"):
        pack_float(torch.tensor([[1.0, float("nan")]]), "bf16")
    assert torch.equal(unpack_float(pack_float(torch.tensor([[1.0, 7.0e4]]), "bf16")), torch.tensor([[1.0, 70144.0]]))
