"""Compiled batch-invariant attention (kernels/attention.py): bitwise row invariance across S, tree rows,
sliding windows, soft-capping, thread counts, GQA shapes of the real models, parity with the torch twin,
fp16 caches (read as their exact fp32 widening), errors.

Fast (tiny caches); the first run compiles the kernels (cached under speczoo's home).
"""

from __future__ import annotations

import pytest
import torch

from speczoo.kernels import attention, native

S_VALUES = (1, 2, 5, 9, 17)
# (H, Hkv, Dh) of Qwen2.5-Coder 0.5B, 1.5B, Gemma 3 270m, and a tiny MHA shape
GQA = ((14, 2, 64), (12, 2, 128), (4, 1, 256), (4, 4, 16))


def _data(h: int, hkv: int, dh: int, cap: int = 96, s: int = 17, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(hkv, cap, dh, generator=g)                    # [Hkv, C, Dh]
    v = torch.randn(hkv, cap, dh, generator=g)
    q = torch.randn(s, h, dh, generator=g) * (2.0 / dh ** 0.5)     # [S, H, Dh] (scaled, as the model passes it)
    return q, k, v


def _chain(l0: int, s: int, window: int = 0, start: int = 0) -> attention.KeyRows:
    rows = []
    for i in range(s):
        p = start + l0 + i          # position of row i (slot == position - start)
        lo = max(0, p - window + 1 - start) if window > 0 else 0
        rows.append((lo, l0 + i + 1))
    return attention.KeyRows.from_rows(rows)


@pytest.mark.parametrize("h,hkv,dh", GQA)
def test_rows_are_bit_identical_across_s_and_match_the_twin(h, hkv, dh):
    q, k, v = _data(h, hkv, dh)
    l0 = 40
    full = attention.attend(q, k, v, _chain(l0, 17))              # [17, H, Dh]
    ref = attention.attend_torch(q, k, v, _chain(l0, 17))
    assert full.shape == (17, h, dh) and full.dtype == torch.float32
    torch.testing.assert_close(full, ref, rtol=1e-5, atol=2e-5)
    for s in S_VALUES:
        out = attention.attend(q[:s], k, v, _chain(l0, s))
        assert torch.equal(out, full[:s]), f"S={s} differs from the 17-row forward"
    for i in range(17):   # one decode step per row: row i sees slots [0, l0 + i]
        one = attention.attend(q[i:i + 1], k, v, attention.KeyRows.from_rows([(0, l0 + i + 1)]))
        assert torch.equal(one[0], full[i]), f"row {i} differs from its single-row forward"


@pytest.mark.parametrize("h,hkv,dh", GQA[:3])
def test_tree_rows_equal_the_decode_of_their_path(h, hkv, dh):
    q, k, v = _data(h, hkv, dh, s=6)
    l0 = 30
    # a tree of 6 new slots: 0 -> (1 -> 3 -> 5), (2 -> 4); row i sees the prefix and its ancestors
    parents = {0: None, 1: 0, 2: 0, 3: 1, 4: 2, 5: 3}
    rows = []
    for i in range(6):
        path, j = [], i
        while j is not None:
            path.append(j)
            j = parents[j]
        rows.append(torch.cat((torch.arange(0, l0), l0 + torch.tensor(sorted(path)))))
    tree = attention.attend(q, k, v, attention.KeyRows.from_rows(rows))
    for i in (3, 4, 5):
        path = rows[i][l0:]
        k2, v2 = k.clone(), v.clone()        # compact the path next to the prefix, as KVCache.compact does
        k2[:, l0:l0 + len(path)] = k[:, path]
        v2[:, l0:l0 + len(path)] = v[:, path]
        chain = attention.attend(q[i:i + 1], k2, v2, attention.KeyRows.from_rows([(0, l0 + len(path))]))
        assert torch.equal(chain[0], tree[i]), f"tree row {i} differs from the decode of its path"
    torch.testing.assert_close(tree, attention.attend_torch(q, k, v, attention.KeyRows.from_rows(rows)),
                               rtol=1e-5, atol=2e-5)


def test_sliding_window_rows_are_invariant_and_match_the_twin():
    h, hkv, dh = 4, 1, 256
    q, k, v = _data(h, hkv, dh, cap=96)
    l0, w = 50, 24
    full = attention.attend(q, k, v, _chain(l0, 17, window=w))
    ref = attention.attend_torch(q, k, v, _chain(l0, 17, window=w))
    torch.testing.assert_close(full, ref, rtol=1e-5, atol=2e-5)
    assert int(_chain(l0, 17, window=w).lo[5]) > 0
    for s in S_VALUES:
        assert torch.equal(attention.attend(q[:s], k, v, _chain(l0, s, window=w)), full[:s])
    # keys outside the window must not matter
    k2, v2 = k.clone(), v.clone()
    k2[:, :l0 - w] = 1e3
    v2[:, :l0 - w] = float("nan")
    assert torch.equal(attention.attend(q[:1], k2, v2, _chain(l0, 1, window=w)), full[:1])


def test_result_does_not_depend_on_thread_count():
    q, k, v = _data(12, 2, 128)
    keys = _chain(40, 17)
    threads = torch.get_num_threads()
    try:
        a = attention.attend(q, k, v, keys)
        torch.set_num_threads(1)
        b = attention.attend(q, k, v, keys)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(a, b)


def test_portable_build_matches_the_twin():
    lib = native.kernels(native.scalar_path())
    for h, hkv, dh in GQA:
        q, k, v = _data(h, hkv, dh)
        keys = _chain(40, 9)
        out = attention.attend(q[:9], k, v, keys, lib=lib)
        torch.testing.assert_close(out, attention.attend_torch(q[:9], k, v, keys), rtol=1e-5, atol=2e-5)
        for i in range(9):
            one = attention.attend(q[i:i + 1], k, v, attention.KeyRows.from_rows([(0, 41 + i)]), lib=lib)
            assert torch.equal(one[0], out[i])


def test_long_context_and_a_single_key():
    q, k, v = _data(12, 2, 128, cap=700, s=2)
    keys = attention.KeyRows.from_rows([(0, 1), (0, 690)])
    out = attention.attend(q, k, v, keys)
    assert torch.equal(out[0], v[torch.arange(12) // 6, 0])   # one key: softmax is exactly 1
    torch.testing.assert_close(out, attention.attend_torch(q, k, v, keys), rtol=1e-5, atol=2e-5)


def test_a_cache_the_kernel_does_not_read_takes_the_twin():
    q, k, v = _data(4, 2, 16)
    keys = _chain(20, 3)
    out = attention.attend(q[:3], k.bfloat16(), v.bfloat16(), keys)
    assert torch.equal(out, attention.attend_torch(q[:3], k.bfloat16(), v.bfloat16(), keys))


@pytest.mark.parametrize("h,hkv,dh", (*GQA, (4, 2, 40)))
def test_an_fp16_cache_reads_as_its_exact_fp32_widening(h, hkv, dh):
    """An fp16 cache gives the very bits of the fp32 kernel over the same values widened (the kernel converts
    each loaded element exactly); its rows stay invariant across S and tree rows (Dh = 40: a partial chunk)."""
    q, k, v = _data(h, hkv, dh)
    k16, v16 = k.half(), v.half()
    keys = _chain(40, 17)
    full = attention.attend(q, k16, v16, keys)
    assert torch.equal(full, attention.attend(q, k16.float(), v16.float(), keys))
    for s in (1, 5):
        assert torch.equal(attention.attend(q[:s], k16, v16, _chain(40, s)), full[:s])
    tree = attention.KeyRows.from_rows([torch.tensor([0, 3, 7, 41, 44])] * 2)
    assert torch.equal(attention.attend(q[:2], k16, v16, tree), attention.attend(q[:2], k16.float(), v16.float(), tree))
    torch.testing.assert_close(full, attention.attend_torch(q, k16, v16, keys), rtol=1e-5, atol=2e-5)


def test_the_kernels_fp16_rounding_is_torchs():
    """sz_f32_to_f16 (how the compiled blocks write an fp16 cache) rounds exactly as Tensor.half(): ties to
    even, subnormals, overflow to infinity, signed zeros."""
    g = torch.Generator().manual_seed(3)
    edges = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e9, float("inf"), -float("inf"),
                          2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 3 * 2.0 ** -26, 1e-30, 1.0 + 2.0 ** -11,
                          1.0 + 3 * 2.0 ** -11, 2049.0, 2051.0, 6.1e-5])
    ulps = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16).float()   # every fp16
    ulps = ulps[torch.isfinite(ulps)]
    mids = (ulps[:-1].double() + ulps[1:].double()) / 2                  # halfway points (exact in fp32 or not)
    x = torch.cat((edges, torch.randn(20000, generator=g) * 30, torch.randn(2000, generator=g) * 1e-5, ulps,
                   mids.float(), torch.nextafter(mids.float(), torch.tensor(0.0)))).contiguous()
    y = torch.empty(x.numel(), dtype=torch.float16)
    native.kernels().to_f16_fn(x.data_ptr(), x.numel(), y.data_ptr())
    want = x.half()
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))
    nan = torch.tensor([float("nan"), -float("nan")])
    out = torch.empty(2, dtype=torch.float16)
    native.kernels().to_f16_fn(nan.data_ptr(), 2, out.data_ptr())
    assert torch.isnan(out.float()).all()


def test_bad_plans_are_clear_errors():
    q, k, v = _data(4, 2, 16, cap=32, s=2)
    with pytest.raises(ValueError, match="at least one key"):
        attention.attend(q[:1], k, v, attention.KeyRows.from_rows([(3, 3)]))
    with pytest.raises(ValueError, match="inside the cache"):
        attention.attend(q[:1], k, v, attention.KeyRows.from_rows([(0, 33)]))
    with pytest.raises(ValueError, match="inside the cache"):
        attention.attend(q[:1], k, v, attention.KeyRows.from_rows([torch.tensor([0, 40])]))
    with pytest.raises(ValueError, match="plan has 1 rows"):
        attention.attend(q, k, v, attention.KeyRows.from_rows([(0, 3)]))
    with pytest.raises(ValueError, match="multiple of Hkv"):
        attention.attend(torch.randn(1, 3, 16), k, v, attention.KeyRows.from_rows([(0, 3)]))


@pytest.mark.parametrize("softcap", (50.0, 2.0))
def test_soft_capped_rows_are_invariant_and_match_the_twin(softcap):
    """Gemma 2's attention-logit soft-capping (softcap * tanh(score / softcap)): the kernel's lane-wise tanh
    is the twin's torch.tanh to round-off, rows stay bit-identical across S, and capping changes the result
    (scores here reach past 2, where the cap bends them)."""
    h, hkv, dh = 8, 2, 32
    q, k, v = _data(h, hkv, dh)
    q = q * 4                                                     # scores up to ~10: both tanh branches run
    l0 = 40
    full = attention.attend(q, k, v, _chain(l0, 17), softcap=softcap)
    torch.testing.assert_close(full, attention.attend_torch(q, k, v, _chain(l0, 17), softcap), rtol=1e-5, atol=2e-5)
    for s in S_VALUES:
        assert torch.equal(attention.attend(q[:s], k, v, _chain(l0, s), softcap=softcap), full[:s])
    plain = attention.attend(q, k, v, _chain(l0, 17))
    assert not torch.allclose(full, plain, atol=1e-3)


def test_kernel_soft_cap_is_tanh_to_round_off():
    """The kernel's tanh (a Taylor series below |y| = 1/8, (1 - e) / (1 + e) above) against torch.tanh over
    the whole range, through one-key-pair attention: with two keys of scores 0 and x, the weight of the
    second is sigmoid(cap * tanh(x / cap))."""
    cap = 3.0
    xs = torch.cat((torch.linspace(-40, 40, 801), torch.tensor([1e-6, -1e-6, 0.374, 0.376, -0.374, -0.376])))
    dh = 16
    q = torch.zeros(len(xs), 1, dh)
    q[:, 0, 0] = xs                                               # score of key 1 = x, of key 0 = 0
    k = torch.zeros(1, 2, dh)
    k[0, 1, 0] = 1.0
    v = torch.zeros(1, 2, dh)
    v[0, 1, 0] = 1.0                                              # output = weight of key 1
    out = attention.attend(q, k, v, attention.KeyRows.from_rows([(0, 2)] * len(xs)), softcap=cap)[:, 0, 0]
    want = torch.sigmoid((torch.tanh(xs.double() / cap) * cap)).float()
    torch.testing.assert_close(out, want, rtol=2e-6, atol=2e-7)
