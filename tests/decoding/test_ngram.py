"""Unit tests of the prompt-lookup n-gram index and drafter."""

import pytest

from speczoo.decoding.drafters.ngram import NgramDrafter, NgramIndex
from speczoo.decoding.types import Draft
from speczoo.decoding.verify.greedy import verify_greedy


def test_empty_history_proposes_nothing():
    d = NgramDrafter(3)
    assert d.propose([], 4).tokens == []
    assert d.propose([5], 4).tokens == []        # a single token has no earlier occurrence


def test_most_recent_occurrence_wins():
    idx = NgramIndex(2)
    idx.extend([1, 2, 3, 9, 1, 2, 4, 7, 1, 2])
    assert idx.lookup(3) == [4, 7, 1]             # "1 2" last seen before the suffix is followed by 4


def test_falls_back_to_shorter_orders():
    idx = NgramIndex(3)
    idx.extend([5, 6, 7, 8, 0, 0, 7])             # "0 0 7" and "0 7" unseen, "7" seen -> 8 ...
    assert idx.lookup(2) == [8, 0]


def test_min_order_blocks_fallback():
    idx = NgramIndex(3, min_order=2)
    idx.extend([5, 6, 7, 8, 0, 0, 7])
    assert idx.lookup(2) == []


def test_incremental_updates_equal_batch_build():
    seq = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2]
    a = NgramIndex(3)
    a.extend(seq)
    d = NgramDrafter(3)
    for n in range(1, len(seq) + 1):             # the engine passes the growing context each round
        got = d.propose(seq[:n], 4)
    assert got.tokens == a.lookup(4)
    assert d.index._maps == a._maps


def test_proposal_is_capped_at_k_and_continues_a_repeating_pattern():
    idx = NgramIndex(1)
    idx.extend([1, 2, 3, 4, 1])
    assert idx.lookup(2) == [2, 3]
    # the copy of "2 3 4 1" runs into the present and continues through its own draft
    assert idx.lookup(10) == [2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    idx2 = NgramIndex(2)
    idx2.extend([7, 8, 7, 8])
    assert idx2.lookup(5) == [7, 8, 7, 8, 7]


@pytest.mark.parametrize("lo,hi", [(0, 3), (2, 1)])
def test_bad_orders(lo, hi):
    with pytest.raises(ValueError, match="n-gram orders"):
        NgramIndex(hi, min_order=lo)


def test_verify_all_accept_gives_bonus():
    v = verify_greedy(Draft([4, 5, 6]), [4, 5, 6, 9])
    assert (v.accepted, v.next_token, v.path) == (3, 9, [0, 1, 2])
    assert v.emitted(Draft([4, 5, 6])) == [4, 5, 6, 9]


def test_verify_first_miss_gives_correction():
    v = verify_greedy(Draft([4, 5, 6]), [4, 7, 6, 9])
    assert (v.accepted, v.next_token) == (1, 7)
    v0 = verify_greedy(Draft([4, 5]), [8, 5, 6])
    assert (v0.accepted, v0.next_token) == (0, 8)


def test_verify_empty_draft_is_plain_decoding():
    assert verify_greedy(Draft([]), [3]).next_token == 3
    with pytest.raises(ValueError):
        verify_greedy(Draft([1]), [3])


def test_situation_names_match_length_and_agreement():
    d = NgramDrafter(3)
    assert d.situation([]) is None and d.situation([5]) is None          # nothing to look up yet
    long = list(range(10, 30))
    # the last 12 tokens occurred before (one occurrence, so its continuation trivially agrees)
    assert d.situation(long + [99] + long[:12]) == "8+/agree"
    d = NgramDrafter(3)
    # "7" seen twice, followed by 1 then by 2: a one-token match whose occurrences disagree
    assert d.situation([3, 7, 1, 4, 7, 2, 5, 7]) == "1/mixed"
    d = NgramDrafter(3)
    assert d.situation([3, 8, 7, 1, 4, 8, 7]) == "2-3/agree"             # "8 7" once before
    d = NgramDrafter(3)
    ctx = [1, 2, 3, 4, 5, 9, 2, 3, 4, 5, 6, 0, 2, 3, 4, 5]                 # latest occurrence: 4 tokens
    assert d.situation(ctx) == "4-7/mixed"                                 # ... followed by 9, then by 6
    assert d.propose(ctx, 1).tokens == [6]                                 # the lookup reads that occurrence


def test_match_length_extends_backwards_up_to_the_cap():
    idx = NgramIndex(2)
    seq = list(range(40))
    idx.extend(seq + [77] + seq)
    start = idx.longest()[-1]
    assert start == 40                                   # right after the first copy
    assert idx.match_length(start) == 16                 # capped (Drafting.match_cap)
    assert idx.match_length(start, cap=100) == 40
    assert NgramIndex(2).longest() == []


def test_every_situation_has_a_prior():
    from speczoo.decoding.tuning import DRAFTING
    SITUATION_PRIORS = DRAFTING.situation_priors
    bands, kinds = ("1", "2-3", "4-7", "8+"), ("agree", "mixed")
    assert set(SITUATION_PRIORS) == {f"{b}/{k}" for b in bands for k in kinds}
    assert all(0 < a < 1 for a in SITUATION_PRIORS.values())
    assert NgramDrafter.situation_priors is SITUATION_PRIORS




def test_the_occurrence_matching_furthest_back_wins_over_the_most_recent():
    # "5 6" occurs twice: first after "1 2 3 4" (continued by 7 8), then after "9 4" (continued by 0 0).
    # The context ends in "2 3 4 5 6": the first occurrence matches it 5 ids back, the latest only 3.
    idx = NgramIndex(2)
    idx.extend([1, 2, 3, 4, 5, 6, 7, 8, 9, 4, 5, 6, 0, 0, 2, 3, 4, 5, 6])
    assert idx.lookup(2) == [7, 8]
    assert idx.situation() == "4-7/mixed"          # the band of the occurrence copied; the two disagree
    assert idx.ahead([], 2) == ("4-7/mixed", [7, 8])
    d = NgramDrafter(2)
    assert d.propose([1, 2, 3, 4, 5, 6, 7, 8, 9, 4, 5, 6, 0, 0, 2, 3, 4, 5, 6], 2).tokens == [7, 8]


def test_a_passage_copied_line_by_line_follows_its_own_next_line():
    # Lines that end alike (a grep's lines, JSON fields): the most recent occurrence of the shared tail
    # is the line copied last; the one that continues the passage is the occurrence after the copied line.
    a, b, c, tail = [11, 12], [21, 22], [31, 32], [7, 7, 7, 9]
    source = a + tail + b + tail + c + tail
    idx = NgramIndex(3)
    idx.extend(source + [50] + a + tail)           # the answer has copied line a: next comes line b
    assert idx.lookup(2) == b
    idx = NgramIndex(3)
    idx.extend(source + [50] + a + tail + b + tail)
    assert idx.lookup(2) == c


def test_the_choice_looks_back_at_most_lookup_reach_ids():
    from speczoo.decoding.tuning import DRAFTING
    reach = DRAFTING.lookup_reach
    shared = list(range(100, 100 + reach))
    # the older occurrence matches reach + 1 ids back, the latest `reach`: within the reach they tie,
    # so the most recent wins
    idx = NgramIndex(2)
    idx.extend([9] + shared + [7] + [2] + shared + [8] + [9] + shared)
    assert idx.match_length(1 + reach, cap=reach + 5) == reach + 1
    assert idx.lookup(1) == [8]
