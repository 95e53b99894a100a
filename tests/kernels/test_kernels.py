"""Integer and float linear backends: bitwise batch invariance, bit-identical torch twins, parity with fp32,
packing.

Fast (tiny shapes); the first run compiles the kernels (a few seconds, cached under speczoo's home).
Speed is not tested here: `python -m benchmarks.kernel_bench` measures it.
"""

from __future__ import annotations

import pytest
import torch

from speczoo.kernels import native
from speczoo.kernels.backends import BACKENDS, DEFAULT_FAST_BACKEND, get_backend
from speczoo.kernels.pack import (Q4Codes, pack_q4, pack_q4_codes, pack_q8, q4_groups, quantize_q4, quantize_q8,
                                  unpack_q4, unpack_q8)
from speczoo.kernels.quantized import (Q4Backend, Q6Backend, Q8Backend, Q8bBackend, Q8bmBackend, Q40Backend,
                                       Q50Backend, Q80Backend, quantize_blocks)

INT_BACKENDS = ("q8", "q4", "q8b", "q8bm", "q40", "q50", "q80", "q6", "q8_torch", "q4_torch", "q8b_torch", "q8bm_torch",
                "q40_torch", "q50_torch", "q80_torch", "q6_torch")
FLOAT_BACKENDS = ("f32", "f16", "bf16w")       # the float formats (weights rounded to them here; no torch twin)
TWINS = (("q8", "q8_torch"), ("q4", "q4_torch"), ("q8b", "q8b_torch"), ("q8bm", "q8bm_torch"), ("q40", "q40_torch"),
         ("q50", "q50_torch"), ("q80", "q80_torch"), ("q6", "q6_torch"))
S_VALUES = (1, 2, 5, 9, 17)
# K or N off every block size (16 columns, 32/256 inputs), plus the 1.5B's and the 0.5B's own K (896 ends
# in a half super-block)
SHAPES = ((1, 1), (17, 33), (50, 600), (40, 1536), (33, 2000), (24, 896))


def _weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05, torch.randn(n, generator=g)


def _acts(s: int, k: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(s, k, generator=g)
    x[:, : max(1, k // 50)] *= 20.0  # a few outlier channels, as real activations have
    return x


@pytest.fixture(scope="module")
def packed_cache():
    cache: dict = {}

    def get(fam: str, n: int, k: int):
        if (fam, n, k) not in cache:
            w, b = _weights(n, k)
            cache[(fam, n, k)] = (w, b, get_backend(fam).pack(w))
        return cache[(fam, n, k)]

    return get


def _family(name: str) -> str:
    return name.split("_")[0]


@pytest.mark.parametrize("name", INT_BACKENDS + FLOAT_BACKENDS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_rows_are_bit_identical_across_s(name, n, k, packed_cache):
    w, b, packed = packed_cache(_family(name), n, k)
    backend = get_backend(name)
    assert backend.batch_invariant and backend.stored
    m = backend.build(packed, b)
    x = _acts(max(S_VALUES), k)
    singles = [m(x[i : i + 1])[0] for i in range(x.shape[0])]
    for s in S_VALUES:
        y = m(x[:s])
        assert y.shape == (s, n) and y.dtype == torch.float32
        for i in range(s):
            assert torch.equal(y[i], singles[i]), f"{name} row {i} of S={s} differs from S=1"


@pytest.mark.parametrize("name", INT_BACKENDS + FLOAT_BACKENDS)
def test_non_contiguous_and_batched_inputs(name, packed_cache):
    n, k = 50, 600
    w, b, packed = packed_cache(_family(name), n, k)
    m = get_backend(name).build(packed, b)
    x = _acts(9, k)
    ref = m(x)
    wide = torch.zeros(9, 2 * k)
    wide[:, ::2] = x
    assert torch.equal(m(wide[:, ::2]), ref)             # column stride 2
    padded = torch.zeros(9, k + 7)
    padded[:, :k] = x
    assert torch.equal(m(padded[:, :k]), ref)           # row stride > K
    assert torch.equal(m(x.t().contiguous().t()), ref)  # column-major storage
    assert torch.equal(m(x[::2]), ref[::2])             # every other row
    assert torch.equal(m(x.view(3, 3, k)), ref.view(3, 3, n))
    assert m(x[:0]).shape == (0, n)


@pytest.mark.parametrize("fast,twin", TWINS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_compiled_kernel_equals_torch_twin(fast, twin, n, k, packed_cache):
    w, b, packed = packed_cache(fast, n, k)
    x = _acts(13, k)
    for bias in (b, None):
        y = get_backend(fast).build(packed, bias)(x)
        yt = get_backend(twin).build(packed, bias)(x)
        assert torch.equal(y, yt), f"{fast} vs {twin}: max diff {(y - yt).abs().max().item()}"


def test_scalar_build_matches_vnni_build(packed_cache):
    """The portable (no AVX-512) code path of the same source gives the same bits."""
    lib = native.kernels(native.scalar_path())
    assert lib.path_name == "scalar"
    for fam, backend in (("q8", Q8Backend), ("q4", Q4Backend), ("q8b", Q8bBackend), ("q8bm", Q8bmBackend),
                         ("q40", Q40Backend), ("q50", Q50Backend), ("q80", Q80Backend), ("q6", Q6Backend)):
        w, b, packed = packed_cache(fam, 33, 600)
        x = _acts(5, 600)
        assert torch.equal(backend(native.scalar_path()).build(packed, b)(x), get_backend(fam).build(packed, b)(x))


# stated tolerances: relative Frobenius error of the product against fp32 (Gaussian weights; activations with
# 20x outlier channels, which the int8 activation scale of the block holding them pays for: q8 measures
# 0.016-0.020 here (it measured ~0.028 with one scale per row), q8b 0.007-0.009, q8bm 0.007-0.009 (its
# offsets centre each group's range; the activation rounding dominates), q6 0.019-0.021, q4 0.066-0.078,
# q40 0.079-0.088 (llama.cpp's Q4_0 rounding: 16 levels a block of 32, no search), q50 and q80 their own
# rounding (32 and 255 levels a block of 32))
TOLERANCE = {"q8": 0.04, "q4": 0.12, "q8b": 0.015, "q8bm": 0.015, "q6": 0.035, "q40": 0.12, "q50": 0.06, "q80": 0.015,
             # the float formats round only the weights (fp16: 11 significant bits, bf16: 8) and never x
             "f32": 1e-6, "f16": 1e-3, "bf16w": 5e-3}


@pytest.mark.parametrize("name", INT_BACKENDS + FLOAT_BACKENDS)
@pytest.mark.parametrize("n,k", ((50, 600), (40, 1536)))
def test_parity_with_fp32(name, n, k, packed_cache):
    w, b, packed = packed_cache(_family(name), n, k)
    x = _acts(9, k)
    ref = torch.nn.functional.linear(x, w, b)
    y = get_backend(name).build(packed, b)(x)
    rel = ((y - ref).norm() / ref.norm()).item()
    assert rel < TOLERANCE[_family(name)], f"{name}: relative error {rel:.4f}"


@pytest.mark.parametrize("name", INT_BACKENDS + FLOAT_BACKENDS)
def test_zero_rows_and_zero_weights(name):
    n, k = 20, 300
    w, b = _weights(n, k)
    w[3] = 0.0                              # an all-zero output column
    packed = get_backend(_family(name)).pack(w)
    m = get_backend(name).build(packed, b)
    x = _acts(4, k)
    x[1] = 0.0                              # an all-zero input row
    y = m(x)
    assert torch.equal(y[1], b)
    assert torch.equal(y[:, 3], b[3].expand(4))
    assert torch.isfinite(y).all()


def test_pack_is_deterministic_and_thread_independent():
    w, _ = _weights(70, 700)
    threads = torch.get_num_threads()
    try:
        for fam in ("q8", "q4", "q8b", "q8bm", "q40", "q50", "q80", "q6"):
            a = get_backend(fam).pack(w)
            torch.set_num_threads(1)
            b = get_backend(fam).pack(w.clone())
            torch.set_num_threads(threads)
            assert a.keys() == b.keys()
            for key in a:
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), f"{fam}.{key} differs"
    finally:
        torch.set_num_threads(threads)


def test_unpack_inverts_pack():
    w, _ = _weights(37, 530)
    q, scale = quantize_q8(w)
    q2, scale2 = unpack_q8(pack_q8(w))
    assert torch.equal(q, q2) and torch.equal(scale, scale2)
    codes = quantize_q4(w)
    back = unpack_q4(pack_q4(w))
    for field in ("q", "sc", "m", "d", "dm"):
        assert torch.equal(getattr(codes, field), getattr(back, field)), field
    deq = back.dequantize()[:, :530]
    assert ((deq - w).norm() / w.norm()).item() < 0.1


def _q4k_like(n: int, k: int, seed: int = 3) -> torch.Tensor:
    """Weights exactly on llama.cpp Q4_K grids: w = d*sc*q - dmin*m, fp16 d/dmin, 6-bit sc/m, q in 0..15."""
    g = torch.Generator().manual_seed(seed)
    kb = k // 256
    d = (torch.rand(n, kb, generator=g) * 1e-3 + 1e-4).half().float()
    dmin = (torch.rand(n, kb, generator=g) * 1e-3 + 1e-4).half().float()
    sc = torch.randint(1, 64, (n, kb, 8), generator=g)
    sc[:, :, 0] = 63                      # llama.cpp scales the largest sub-scale to 63
    m = torch.randint(0, 64, (n, kb, 8), generator=g)
    m[:, :, 1] = 63
    q = torch.randint(0, 16, (n, kb, 8, 32), generator=g)
    q[..., 0] = 0                         # the group minimum sits at code 0
    top = torch.randint(12, 16, (n, kb, 8), generator=g)
    top[:, :, 0] = 15
    q = torch.minimum(q, top[..., None])
    q[..., 1] = top                       # the top code of a group may be 12..15
    a = (d[:, :, None] * sc.float())[..., None]
    b = (dmin[:, :, None] * m.float())[..., None]
    return (a * q.float() - b).reshape(n, k)


def test_q4_holds_q4k_weights_exactly():
    w = _q4k_like(24, 512)
    deq = quantize_q4(w).dequantize()
    rel = ((deq - w).norm() / w.norm()).item()
    assert rel < 1e-6, f"a Q4_K-grid weight should repack without loss, got relative error {rel:.2e}"


def test_q4_codes_roundtrip_through_layout():
    g = torch.Generator().manual_seed(5)
    n, kp = 19, 512
    codes = Q4Codes(
        q=torch.randint(0, 16, (n, kp), generator=g, dtype=torch.uint8),
        sc=torch.randint(0, 256, (n, kp // 32), generator=g, dtype=torch.uint8),
        m=torch.randint(0, 256, (n, kp // 32), generator=g, dtype=torch.uint8),
        d=torch.rand(n, kp // 256, generator=g),
        dm=torch.rand(n, kp // 256, generator=g),
    )
    back = unpack_q4(pack_q4_codes(codes, n, 500))
    for field in ("q", "sc", "m", "d", "dm"):
        assert torch.equal(getattr(codes, field), getattr(back, field)), field


def _padded_layout(packed: dict) -> dict:
    """The q4 layout stored by bundles pulled before partial super-blocks: K padded to whole super-blocks
    with all-zero groups, qs [NB, KB, 8, 4, 16, 4], sc [NB, KB, 8, 16], mn [NB, KB, 4, 16, 2]."""
    nb, kb = packed["qs"].shape[0], packed["dd"].shape[1]

    def pad(t, groups, shape):
        out = torch.zeros((nb, groups) + tuple(t.shape[2:]), dtype=t.dtype)
        out[:, : t.shape[1]] = t
        return out.view(shape)

    return {**packed, "qs": pad(packed["qs"], kb * 8, (nb, kb, 8, 4, 16, 4)),
            "sc": pad(packed["sc"], kb * 8, (nb, kb, 8, 16)), "mn": pad(packed["mn"], kb * 4, (nb, kb, 4, 16, 2))}


@pytest.mark.parametrize("k", (896, 600, 33, 1536))
def test_q4_stores_no_padding_groups_and_reads_padded_packings_alike(k, packed_cache):
    """A K off the 256-input super-block (the 0.5B's 896) is packed to the next 64 inputs, not to 1024: the
    kernel streams 12.5% fewer bytes there. A packing padded to whole super-blocks (as bundles pulled
    before stored it) loads into the same compact layout and gives the same bits."""
    w, b, packed = packed_cache("q4", 24, k)
    g = q4_groups(k)
    assert g == 2 * -(-k // 64) and packed["qs"].shape == (2, g, 4, 16, 4)
    assert packed["sc"].shape == (2, g, 16) and packed["mn"].shape == (2, g // 2, 16, 2)
    assert packed["dd"].shape == (2, -(-g // 8), 2, 16)
    old = _padded_layout(packed)
    assert old["qs"].numel() == 2 * -(-k // 256) * 2048
    x = _acts(11, k)
    for fam in ("q4", "q4_torch"):
        y = get_backend(fam).build(packed, b)(x)
        assert torch.equal(y, get_backend(fam).build(old, b)(x)), fam
    assert torch.equal(get_backend("q4").build(packed, b)(x), get_backend("q4_torch").build(packed, b)(x))
    for field in ("q", "sc", "m", "d", "dm"):
        assert torch.equal(getattr(unpack_q4(packed), field), getattr(unpack_q4(old), field)), field
    m = get_backend("q4").build(old, b)
    assert m.qs.shape == packed["qs"].shape                  # the padding is dropped at load


def test_activation_quantization_is_per_block_of_a_row():
    x = _acts(5, 600)                                          # blocks of 256, 256 and 88 inputs
    xq, sa = quantize_blocks(x)
    assert xq.shape == (5, 600) and sa.shape == (5, 3) and xq.dtype == torch.int8
    xq1, sa1 = quantize_blocks(x[2:3])
    assert torch.equal(xq[2], xq1[0]) and torch.equal(sa[2], sa1[0])          # rows are independent
    for b, (k0, k1) in enumerate(((0, 256), (256, 512), (512, 600))):
        assert torch.equal(xq[:, k0:k1].abs().amax(1), torch.full((5,), 127, dtype=torch.int8))
        assert torch.equal(sa[:, b], x[:, k0:k1].abs().amax(1) / 127.0)
    y = x.clone()
    y[:, 300] = 1e3                                            # an outlier costs only its own block resolution
    yq, ya = quantize_blocks(y)
    assert torch.equal(yq[:, :256], xq[:, :256]) and torch.equal(yq[:, 512:], xq[:, 512:])
    assert not torch.equal(yq[:, 256:512], xq[:, 256:512])
    z = torch.zeros(2, 300)
    z[1, 280] = 2.0                                            # all-zero blocks quantize to zeros, scale 0
    zq, za = quantize_blocks(z)
    assert torch.equal(za, torch.tensor([[0.0, 0.0], [0.0, 2.0 / 127.0]])) and int(zq.abs().sum()) == 127


def test_bad_shapes_and_inputs_are_clear_errors():
    w, b = _weights(20, 64)
    with pytest.raises(ValueError, match="2-D"):
        get_backend("q4").pack(w[0])
    with pytest.raises(ValueError, match="NaN or inf"):
        get_backend("q8").pack(torch.full((4, 4), float("nan")))
    with pytest.raises(ValueError, match="unknown linear backend"):
        get_backend("q3")
    for name in INT_BACKENDS:
        packed = get_backend(_family(name)).pack(w)
        m = get_backend(name).build(packed, b)
        with pytest.raises(ValueError, match=r"x\[\.\.\., 64\]"):
            m(torch.randn(3, 65))
        with pytest.raises(TypeError, match="fp32"):
            m(torch.randn(3, 64, dtype=torch.float64))
        with pytest.raises(ValueError, match="bias"):
            get_backend(name).build(packed, torch.zeros(21))
        with pytest.raises(ValueError, match="lacks"):
            get_backend(name).build({"meta": packed["meta"]}, None)


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(native.KernelBuildError, match="q8_torch"):
        native._build(native.chosen_path())


def test_default_fast_backend_is_batch_invariant():
    assert DEFAULT_FAST_BACKEND in BACKENDS
    assert get_backend(DEFAULT_FAST_BACKEND).batch_invariant


def test_q4mix_keeps_4bit_grids_and_falls_back_to_q8_elsewhere():
    mix = get_backend("q4mix")
    assert mix.batch_invariant and mix.stored
    on_grid = mix.pack(_q4k_like(24, 512))
    off_grid, _ = _weights(24, 512)
    assert "qs" in on_grid and "w8" in mix.pack(off_grid)
    x = _acts(9, 512)
    for packed in (on_grid, mix.pack(off_grid)):
        m = mix.build(packed, None)
        y = m(x)
        assert all(torch.equal(m(x[i : i + 1])[0], y[i]) for i in range(9))


@pytest.mark.parametrize("fam", ("q4", "q8"))
def test_fused_linears_are_bit_identical_to_separate_calls(fam):
    from speczoo.kernels.fused import FusedLinears

    k = 600
    shapes = ((48, 7), (16, 8), (32, 9))   # N multiples of the 16-column strip
    for with_bias in (True, False):
        mods = []
        for n, seed in shapes:
            w, b = _weights(n, k, seed)
            mods.append(get_backend(fam).build(get_backend(fam).pack(w), b if with_bias else None))
        fused = FusedLinears(mods)
        assert fused.fused is not None and len(fused.parts) == 0
        x = _acts(9, k)
        outs = fused(x)
        for m, y in zip(mods, outs):
            assert torch.equal(y, m(x))
        assert all(torch.equal(fused(x[i:i + 1])[0][0], outs[0][i]) for i in range(9))


def test_fused_linears_call_each_module_when_they_cannot_share_a_call():
    from speczoo.kernels.fused import FusedLinears

    w1, b1 = _weights(20, 300, 1)           # N not a multiple of 16
    w2, b2 = _weights(32, 300, 2)
    q4 = get_backend("q4")
    for mods in ([q4.build(q4.pack(w1), b1), q4.build(q4.pack(w2), b2)],            # odd N
                 [q4.build(q4.pack(w2), b2), q4.build(q4.pack(w2), None)],          # bias on one only
                 [q4.build(q4.pack(w2), b2), get_backend("q8").build(get_backend("q8").pack(w2), b2)],
                 [get_backend("q4_torch").build(q4.pack(w2), b2)] * 2):
        fused = FusedLinears(mods)
        assert fused.fused is None
        x = _acts(3, 300)
        for m, y in zip(mods, fused(x)):
            assert torch.equal(y, m(x))
