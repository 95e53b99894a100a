"""The suffix drafter's memory (decoding/drafters/suffix_memory.py): lookup, snapshot semantics, the cap
with oldest-first eviction, tenant isolation and the pooled memory."""

from __future__ import annotations

import gc

import pytest

from speczoo.decoding.drafters.suffix_memory import SEP, SuffixMemory


def test_a_lookup_finds_the_recent_occurrences_it_may_see():
    m = SuffixMemory(cap=100, orders=(2, 3))
    m.remember(None, [1, 2, 3, 1, 2, 4])
    r = m.open(None)
    assert r.occurrences((1, 2), limit=8) == [2, 5]            # positions right after each (1, 2)
    assert [r.token(p) for p in (2, 5, 6)] == [3, 4, SEP]      # an answer ends in SEP
    assert r.occurrences((1, 2), limit=1) == [5]               # the most recent only
    assert r.occurrences((2, 3, 1), limit=8) == [4] and r.occurrences((9, 9), limit=8) == []
    assert r.occurrences((4, 1), limit=8) == []                # no n-gram spans two answers
    m.remember(None, [4, 1, 2, 7])
    assert m.open(None).occurrences((1, 2), limit=8) == [2, 5, 10]


def test_a_recall_sees_the_memory_as_it_was_when_opened():
    m = SuffixMemory(cap=12, orders=(2, 2))
    m.remember(None, [1, 2, 3])
    before = m.open(None)
    m.remember(None, [1, 2, 5])                                # after `before` opened: past its horizon
    assert before.occurrences((1, 2), 8) == [2]
    for _ in range(3):                                         # the answers `before` saw are evicted now
        m.remember(None, [7, 8, 9])
    assert m.open(None).occurrences((1, 2), 8) == []
    assert before.occurrences((1, 2), 8) == [2] and before.token(2) == 3   # still readable to it
    assert m.held() > m.cap >= m.size
    del before
    gc.collect()
    m.remember(None, [7, 8, 9])                                # nobody reads back: freed
    assert m.held() <= m.cap


def test_the_cap_evicts_the_oldest_answers_first_across_tenants():
    m = SuffixMemory(cap=10, orders=(2, 2))
    m.remember("a", [1, 2, 3])                                 # 4 tokens with its SEP
    m.remember("b", [4, 5, 6])
    m.remember("a", [7, 8, 9])                                 # 12 > 10: the oldest ("a"'s first) goes
    assert m.size == 8 and m.held() == 8
    a = m.open("a")
    assert a.occurrences((1, 2), 8) == [] and a.occurrences((7, 8), 8) == [6]
    assert m.open("b").occurrences((4, 5), 8) == [2]
    m.remember("b", list(range(20, 40)))                       # longer than the cap: its end is kept
    assert m.size <= 10 and m.open("b").occurrences((37, 38), 8) and not m.open("b").occurrences((20, 21), 8)
    assert not m.open("a").occurrences((7, 8), 8)


def test_a_tenant_never_reads_another_tenants_answers_unless_pooled():
    m = SuffixMemory(cap=100, orders=(2, 2))
    m.remember("key-b", [1, 2, 3])
    m.remember(None, [1, 2, 4])
    assert m.open("key-a").occurrences((1, 2), 8) == []
    assert [m.open(t).token(p) for t, p in (("key-b", 2), (None, 2))] == [3, 4]
    pooled = SuffixMemory(cap=100, pooled=True, orders=(2, 2))
    pooled.remember("key-b", [1, 2, 3])
    pooled.remember(None, [1, 2, 4])
    assert pooled.open("key-a").occurrences((1, 2), 8) == [2, 6]


def test_a_zero_cap_remembers_nothing_and_a_negative_one_is_refused():
    m = SuffixMemory(cap=0)
    m.remember(None, [1, 2, 3])
    assert m.open(None).empty and m.held() == 0
    with pytest.raises(ValueError, match="cap"):
        SuffixMemory(cap=-1)
