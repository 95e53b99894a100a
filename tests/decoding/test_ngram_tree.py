"""Prompt lookup's tree: what the controller's pricing of it relies on (a smaller budget's tree is the first
nodes of a larger one's), and where `auto` offers it (only where the suffix's occurrences branch)."""

from __future__ import annotations

import random

from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.verify.tree import is_chain


def test_a_smaller_budget_gives_the_first_nodes_of_a_larger_ones_tree():
    """TreeAcceptance reads a(N) for every N below a round's budget off one accepted path: it holds only
    if the N-node tree is the first N nodes of the K-node tree."""
    rng = random.Random(5)
    branched = 0
    for _ in range(200):
        vocab = rng.choice([3, 5, 8])
        context = [rng.randrange(vocab) for _ in range(rng.randint(2, 60))]
        for order in (1, 2, 3):
            full = NgramTreeDrafter(max_order=order).propose(context, 16)
            branched += not is_chain(full.parents)
            for n in range(1, 16):
                cut = NgramTreeDrafter(max_order=order).propose(context, n)
                assert cut.tokens == full.tokens[:n] and (cut.parents or []) == (full.parents or [])[:n], (context, order, n)
    assert branched > 50


def test_inside_auto_the_tree_is_offered_only_where_the_occurrences_branch():
    agree = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 3]       # "1 2 3" was always followed by 9
    mixed = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]       # by 9, then by 7
    named, in_auto = NgramTreeDrafter(), NgramTreeDrafter(branching_only=True)
    assert named.situation(agree).endswith("/agree") and in_auto.situation(agree) is None
    assert NgramTreeDrafter().situation(mixed) == NgramTreeDrafter(branching_only=True).situation(mixed)
    assert NgramTreeDrafter(branching_only=True).situation([1, 2, 3]) is None      # no match at all
