"""KVCache: preallocation (zeros whose pages come as slots fill), O(1) truncate, compact, and
CacheFullError leaving the cache untouched."""

import dataclasses
from pathlib import Path

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.errors import CacheFullError
from tiny import tiny_args, tiny_model


def test_preallocates_capacity_per_layer():
    args = tiny_args("qwen2")
    c = KVCache(args, max_seq=10, extra=5)
    assert c.capacity == 15 and c.length == 0
    assert len(c.k) == len(c.v) == args.n_layers
    assert c.k[0].shape == (args.n_kv_heads, 15, args.head_dim)


def test_truncate_is_a_length_change_only():
    model, args = tiny_model("qwen2")
    c = KVCache(args, 16)
    model(torch.arange(8), torch.arange(8), c)
    ptr, data = c.k[1].data_ptr(), c.k[1].clone()
    c.truncate(3)
    assert c.length == 3
    assert c.k[1].data_ptr() == ptr and torch.equal(c.k[1], data)
    with pytest.raises(ValueError):
        c.truncate(4)
    with pytest.raises(ValueError):
        c.truncate(-1)
    c.reset()
    assert c.length == 0


def test_compact_moves_slots_in_every_layer():
    args = tiny_args("gemma3")
    c = KVCache(args, 12)
    for li in range(args.n_layers):
        c.k[li].copy_(torch.arange(c.capacity, dtype=torch.float32)[None, :, None] + 100 * li)
        c.v[li].copy_(-c.k[li])
    c.length = 10
    c.compact([5, 7, 8], 4)
    for li in range(args.n_layers):
        assert c.k[li][0, 4:7, 0].tolist() == [5 + 100 * li, 7 + 100 * li, 8 + 100 * li]
        assert c.v[li][0, 4:7, 0].tolist() == [-5 - 100 * li, -7 - 100 * li, -8 - 100 * li]
        assert c.k[li][0, :4, 0].tolist() == [100 * li + i for i in range(4)]
    c.truncate(7)
    assert c.length == 7


@pytest.mark.parametrize("src,dst", [([3, 2], 1), ([5], 6), ([1, 11], 0), ([], 0)])
def test_compact_rejects_bad_arguments(src, dst):
    c = KVCache(tiny_args("qwen2"), 12)
    c.length = 10
    if not src:
        c.compact(src, dst)   # nothing to do
        return
    with pytest.raises(ValueError):
        c.compact(src, dst)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_cache_full_raises_before_writing(arch):
    model, args = tiny_model(arch)
    c = KVCache(args, max_seq=6, extra=2)
    model(torch.arange(5), torch.arange(5), c)
    snap_k = [k.clone() for k in c.k]
    snap_v = [v.clone() for v in c.v]
    with pytest.raises(CacheFullError, match="do not fit"):
        model(torch.arange(4), torch.arange(5, 9), c)
    assert c.length == 5
    assert all(torch.equal(a, b) for a, b in zip(snap_k, c.k))
    assert all(torch.equal(a, b) for a, b in zip(snap_v, c.v))
    model(torch.arange(3), torch.arange(5, 8), c)   # exactly fills capacity
    assert c.length == 8


def test_cache_for_another_model_is_refused():
    model, _ = tiny_model("qwen2")
    other = tiny_args("gemma3")
    with pytest.raises(ValueError, match="different model"):
        model(torch.arange(2), torch.arange(2), KVCache(other, 8))


def test_a_hybrids_rollback_equals_recompute_for_every_accepted_length():
    """LFM2's convolution state rolls back with the integer length: after a verify of K + 1 rows, truncating
    to base + 1 + j leaves, bit for bit, the state and K/V of decoding those j + 1 tokens one by one."""
    model, args = tiny_model("lfm2", backend="fp32-rows")
    prompt, verify = torch.arange(11) * 7 % 128, torch.tensor([5, 9, 2, 33, 60, 1])
    for j in range(len(verify)):
        c = KVCache(args, 32)
        model(prompt, torch.arange(11), c)
        model(verify, torch.arange(11, 17), c)                     # one forward of K + 1 = 6 rows
        c.truncate(11 + 1 + j)
        one = KVCache(args, 32)
        model(prompt, torch.arange(11), one)
        for i in range(j + 1):                                     # the accepted rows, one by one
            model(verify[i:i + 1], torch.tensor([11 + i]), one)
        assert torch.equal(c.conv.state(c.length), one.conv.state(one.length))
        assert all(torch.equal(a[:, :c.length], b[:, :c.length]) for a, b in zip(c.k + c.v, one.k + one.v))
        nxt = torch.tensor([44, 45])                               # and what follows is the same too
        assert torch.equal(model(nxt, torch.arange(c.length, c.length + 2), c).logits,
                           model(nxt, torch.arange(one.length, one.length + 2), one).logits)


def test_a_hybrid_cache_refuses_a_rollback_past_its_reach():
    model, args = tiny_model("lfm2")
    c = KVCache(args, 400, extra=0)
    reach = c.conv.ring - c.conv.width
    model(torch.arange(reach + 20) % 128, torch.arange(reach + 20), c)
    c.truncate(21)                                                 # the furthest row written is reach + 19 back
    with pytest.raises(CacheFullError, match="no longer held"):
        c.truncate(19)
    assert c.length == 21
    c.truncate(0)                                                  # a fresh start is always possible
    assert c.conv.nbytes < c.nbytes / 2                            # a few rows per layer beside the K/V


def _rss_bytes() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's resident memory (Linux)")
def test_a_long_context_cache_takes_memory_only_as_its_slots_fill():
    args = dataclasses.replace(tiny_args("qwen2"), n_layers=8, n_kv_heads=4, head_dim=64)
    before = _rss_bytes()
    c = KVCache(args, 32768, dtype=torch.float16)               # 2 x 256 MiB of keys and values
    assert c.nbytes == 2 * 8 * 4 * (32768 + 64) * 64 * 2
    assert _rss_bytes() - before < c.nbytes // 16               # nothing written yet: no page taken
    assert c.k[3][:, 1000].abs().sum() == 0 and c.v[7][:, -1].abs().sum() == 0   # and every slot reads zero
    c.k[0][:, :1024] = 1.0
    assert _rss_bytes() - before >= 1024 * 4 * 64 * 2 // 2      # the slots written are there
