"""Several sequences in one forward (speczoo/slots.py): every row's logits are the same bits as the same
sequence run alone in a KVCache of its own, through prefills, decode steps, verify chains, rollbacks,
token trees, joins and leaves, on the batch-invariant backends (the compiled blocks included)."""

from __future__ import annotations

import random

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.errors import CacheFullError
from speczoo.models.forward import Tree
from speczoo.slots import Feed, SlotCache, forward_batch
from tiny import tiny_model, tree_mask

BACKENDS = ["fp32-rows", "q8", "q4"]


class Alone:
    """The reference: one sequence in its own KVCache, fed through the model's plain forward."""

    def __init__(self, model, capacity: int):
        self.model = model
        self.cache = KVCache(model.args, capacity)

    def feed(self, tokens: list[int], parents: list[int] | None) -> torch.Tensor:
        l0 = self.cache.length
        if parents is None:
            pos = torch.arange(l0, l0 + len(tokens))
            return self.model(torch.tensor(tokens), pos, self.cache).logits
        depth: list[int] = []
        for i, p in enumerate(parents):
            depth.append(0 if p < 0 else depth[p] + 1)
        return self.model(torch.tensor(tokens), torch.tensor([l0 + d for d in depth]), self.cache,
                          attend=Tree(tree_mask(parents))).logits


def random_tree(rng: random.Random, n: int) -> list[int]:
    return [-1] + [rng.randrange(0, i) for i in range(1, n)]


@pytest.mark.parametrize("arch", ["qwen2", "lfm2"])              # lfm2: a hybrid, its convolution state per slot
@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_rows_equal_each_sequence_alone(backend, arch):
    model, args = tiny_model(arch, backend=backend, seed=3)
    rng = random.Random(backend)
    cap = 96
    cache = SlotCache(args, n_slots=4, slot_capacity=cap)
    alone: dict[int, Alone] = {}
    with torch.no_grad():
        for step in range(40):
            # joins: a new sequence takes a free slot with its prompt; leaves: a live one gives its slot back
            if cache.free and (not alone or rng.random() < 0.3):
                slot = cache.acquire()
                alone[slot] = Alone(model, cap)
            if len(alone) > 1 and rng.random() < 0.1:
                slot = rng.choice(sorted(alone))
                cache.release(slot)
                del alone[slot]
            feeds = []
            for slot in sorted(alone):
                room = cap - cache.lengths[slot]
                if room < 10:
                    continue
                if cache.lengths[slot] == 0:
                    n, parents = rng.randint(1, 9), None                    # a prefill
                else:
                    n = rng.choice([1, 1, 3, 6])
                    parents = random_tree(rng, n) if n > 1 and rng.random() < 0.3 else None
                tokens = [rng.randrange(args.vocab_size) for _ in range(n)]
                feeds.append(Feed(slot, tokens, parents))
            if not feeds:
                continue
            rng.shuffle(feeds)                                    # any order of sequences in the forward
            out, batch = forward_batch(model, cache, feeds)
            for f, rows in zip(feeds, batch.rows):
                ref = alone[f.slot].feed(f.tokens, f.parents)
                assert torch.equal(out.logits[rows], ref), f"step {step}, slot {f.slot}: batched != alone"
                # roll back as a verify would: keep a random prefix (a tree: a random root path)
                keep = rng.randint(1, len(f.tokens))
                base = cache.lengths[f.slot] - len(f.tokens)
                if f.parents is None:
                    cache.truncate(f.slot, base + keep)
                    alone[f.slot].cache.truncate(base + keep)
                else:
                    path = [len(f.tokens) - 1]
                    while f.parents[path[-1]] >= 0:
                        path.append(f.parents[path[-1]])
                    path = path[::-1]
                    src = [base + i for i in path]
                    cache.compact(f.slot, src, base)
                    cache.truncate(f.slot, base + len(path))
                    alone[f.slot].cache.compact(src, base)
                    alone[f.slot].cache.truncate(base + len(path))


@pytest.mark.parametrize("arch", ["qwen2", "lfm2"])              # lfm2: a hybrid, its convolution state per slot
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prompt_prefix_held_by_any_slot_is_reused_with_the_same_bits(backend, arch):
    """acquire(prompt) starts a sequence on the rows of its prompt's longest prefix that some slot holds
    (its own kept rows, or a copy from another slot, held or free); what it feeds then gives the logits
    of the same sequence prefilled alone, and the slot's ids follow its rows through rollbacks."""
    model, args = tiny_model(arch, backend=backend, seed=3)
    rng = random.Random(backend + "prefix")
    cap = 64
    cache = SlotCache(args, n_slots=3, slot_capacity=cap)
    heads = [[rng.randrange(args.vocab_size) for _ in range(12)] for _ in range(2)]
    live: dict[int, list[int]] = {}
    reused = 0
    with torch.no_grad():
        for step in range(24):
            if len(live) == cache.n_slots or (live and rng.random() < 0.4):
                slot = rng.choice(sorted(live))
                cache.release(slot)
                del live[slot]
            prompt = rng.choice(heads)[:rng.randint(1, 12)] + [rng.randrange(args.vocab_size)
                                                              for _ in range(rng.randint(0, 6))]
            slot = cache.acquire(prompt)
            kept = cache.lengths[slot]
            assert kept < len(prompt) and cache.ids[slot] == prompt[:kept]
            reused += kept
            out, batch = forward_batch(model, cache, [Feed(slot, prompt[kept:])])
            ref = Alone(model, cap).feed(prompt, None)[kept:]
            assert torch.equal(out.logits[batch.rows[0]], ref), f"step {step}: reused prefix != alone"
            out, _ = forward_batch(model, cache, [Feed(slot, [1, 2, 3])])
            cache.truncate(slot, len(prompt) + 1)                           # a verify's rollback
            live[slot] = prompt + [1]
            for s, ids in live.items():
                assert cache.ids[s] == ids and cache.lengths[s] == len(ids)
    assert reused > 20


def test_kept_conversations_outlive_new_prompts_that_share_only_a_system_prompt():
    """A new prompt that shares only the system prompt with kept rows takes an empty slot (then the one
    released longest ago) and copies the shared rows; a conversation's next turn takes its own slot."""
    _, args = tiny_model("qwen2", backend="fp32-rows", seed=3)
    cache = SlotCache(args, n_slots=3, slot_capacity=32)
    system = [5, 6, 7, 8]
    a, b = system + [1, 1, 1], system + [2, 2, 2]
    for prompt in (a, b):                                       # two conversations, one after the other
        slot = cache.acquire(prompt)
        cache.commit([Feed(slot, prompt[cache.lengths[slot]:])])
        cache.release(slot)
    assert cache.ids[:2] == [a, b] and cache.ids[2] == []
    c = cache.acquire(system + [3])                             # new: the empty slot, the system prompt copied
    assert c == 2 and cache.lengths[c] == 4 and cache.ids[:2] == [a, b]
    cache.commit([Feed(c, [3])])
    cache.release(c)
    d = cache.acquire(system + [4])                             # none empty: the slot released longest ago
    assert d == 0 and cache.lengths[d] == 4 and cache.ids[1] == b
    turn = cache.acquire(b + [9, 9])                            # b's next turn: its own slot, in place
    assert turn == 1 and cache.lengths[turn] == len(b)


def test_a_hybrid_reuses_a_prefix_only_where_its_state_is_held():
    """A hybrid slot keeps its convolution state for the last rows it wrote only: a prompt that shares a
    prefix that lies further back starts afresh (and equals the sequence alone), while one that extends the
    whole kept sequence (a conversation's next turn) reuses it, state included."""
    model, args = tiny_model("lfm2", backend="fp32-rows", seed=3)
    cap = 400
    cache = SlotCache(args, n_slots=1, slot_capacity=cap)
    reach = cache.kv.conv.ring - cache.kv.conv.width
    long = [i % 97 for i in range(reach + 40)]
    with torch.no_grad():
        slot = cache.acquire(long)
        forward_batch(model, cache, [Feed(slot, long)])
        cache.release(slot)
        short = long[:20] + [5, 6]                               # shares 20 rows, further back than the reach
        assert cache.acquire(short) == slot and cache.lengths[slot] == 0
        out, batch = forward_batch(model, cache, [Feed(slot, short)])
        assert torch.equal(out.logits[batch.rows[0]], Alone(model, cap).feed(short, None))
        cache.release(slot)
        turn = short + [7, 8, 9]
        assert cache.acquire(turn) == slot and cache.lengths[slot] == len(short)
        out, batch = forward_batch(model, cache, [Feed(slot, turn[len(short):])])
        assert torch.equal(out.logits[batch.rows[0]], Alone(model, cap).feed(turn, None)[len(short):])
        forward_batch(model, cache, [Feed(slot, [i % 97 for i in range(reach + 10)])])
        with pytest.raises(CacheFullError, match="no longer held"):
            cache.truncate(slot, len(turn))                     # a rollback further back than the reach


def test_rows_of_different_sequences_never_meet():
    """The same tokens fed to two slots with different prefixes give different logits; each equals its own
    sequence alone (nothing leaks across slots)."""
    model, args = tiny_model("qwen2", backend="fp32-rows", seed=5)
    cache = SlotCache(args, n_slots=2, slot_capacity=32)
    a, b = cache.acquire(), cache.acquire()
    with torch.no_grad():
        forward_batch(model, cache, [Feed(a, [1, 2, 3]), Feed(b, [7, 7, 7, 7])])
        out, batch = forward_batch(model, cache, [Feed(a, [9]), Feed(b, [9])])
    assert not torch.equal(out.logits[batch.rows[0]], out.logits[batch.rows[1]])


def test_bad_feeds_are_refused_before_anything_is_written():
    model, args = tiny_model("qwen2", backend="fp32-rows", seed=5)
    cache = SlotCache(args, n_slots=2, slot_capacity=8)
    a = cache.acquire()
    with pytest.raises(CacheFullError, match="do not fit"):
        cache.plan([Feed(a, list(range(9)))])
    with pytest.raises(ValueError, match="one feed per slot"):
        cache.plan([Feed(a, [1]), Feed(a, [2])])
    with pytest.raises(ValueError, match="out of range"):
        cache.plan([Feed(5, [1])])
    assert cache.lengths[a] == 0
    cache.acquire()
    with pytest.raises(CacheFullError, match="in use"):
        cache.acquire()
    gemma, gargs = tiny_model("gemma3", backend="fp32-rows", seed=5)
    with pytest.raises(ValueError, match="sliding-window"):
        SlotCache(gargs, n_slots=2, slot_capacity=8)
