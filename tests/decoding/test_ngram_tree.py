"""Prompt lookup's tree: what the controller's pricing of it relies on (a smaller budget's tree is the first
nodes of a larger one's), how it weighs its candidates (by how far back their match reaches), and where it
is offered beside the chain, as inside `auto` (only where the suffix's occurrences branch)."""

from __future__ import annotations

import random

from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.round import situations
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


def test_the_occurrence_whose_match_reaches_furthest_leads_the_tree_and_ties_branch():
    """A line copied from the passage being quoted outweighs a more recent line that merely ends alike: the
    tree follows it as the chain does (ngram.py); where the occurrences' matches reach equally far, it
    branches."""
    quoted, other = [10, 11, 12, 13], [20, 21, 22, 23]
    context = [5, 6, 7, 1, 2, 3] + quoted + [8, 8, 1, 2, 3] + other + [9, 5, 6, 7, 1, 2, 3]
    draft = NgramTreeDrafter(max_order=3).propose(context, 5)
    assert draft.tokens == quoted + [8] and draft.parents == [-1, 0, 1, 2, 3]
    tied = [9, 1, 2, 3, 10, 11, 9, 1, 2, 3, 20, 21, 9, 1, 2, 3]
    draft = NgramTreeDrafter(max_order=3).propose(tied, 6)
    roots = [t for t, p in zip(draft.tokens, draft.parents) if p == -1]
    assert roots == [20, 10]                        # the most recent first, the other beside it


def test_beside_the_chain_the_tree_is_offered_only_where_the_occurrences_branch():
    """Where the suffix's recent occurrences agree on the next token, the tree starts as the chain does: beside
    the chain (inside `auto`) that round is the chain's, so that the two do not split what it teaches. Alone
    (`--spec ngram-tree`) the tree is offered wherever it has a match."""
    agree = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 3]       # "1 2 3" was always followed by 9
    mixed = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]       # by 9, then by 7

    def offered(context: list[int], alone: bool = False) -> str | None:
        chain = {} if alone else {"ngram": NgramDrafter()}
        return situations({**chain, "ngram-tree": NgramTreeDrafter()}, context)["ngram-tree"]

    assert offered(agree, alone=True).endswith("/agree") and offered(agree) is None
    assert offered(mixed) == offered(mixed, alone=True) == NgramDrafter().situation(mixed)
    assert offered(mixed).endswith("/mixed")
    assert offered([1, 2, 3]) is None and offered([1, 2, 3], alone=True) is None     # no match at all
