"""Token trees: layout (mask, positions, paths) on hand-made trees and greedy tree verification."""

import random

import pytest
import torch

from speczoo.decoding.verify.greedy import verify_tree_greedy
from speczoo.decoding.verify.tree import TreeLayout, check_parents, is_chain
from speczoo.decoding.types import Draft
from speczoo.decoding.verify.greedy import verify_greedy

#        a0 (row 0)
#       /    \
#     n0      n1
#    /  \       \
#  n2    n3      n5
#  |
#  n4
PARENTS = [-1, -1, 0, 0, 2, 1]


def test_layout_of_a_hand_made_tree():
    lay = TreeLayout.from_parents(PARENTS)
    assert lay.depth.tolist() == [0, 1, 1, 2, 2, 3, 2]
    assert lay.positions(10).tolist() == [10, 11, 11, 12, 12, 13, 12]
    want = torch.tensor([
        # a0 n0 n1 n2 n3 n4 n5
        [1, 0, 0, 0, 0, 0, 0],   # a0
        [1, 1, 0, 0, 0, 0, 0],   # n0
        [1, 0, 1, 0, 0, 0, 0],   # n1
        [1, 1, 0, 1, 0, 0, 0],   # n2
        [1, 1, 0, 0, 1, 0, 0],   # n3
        [1, 1, 0, 1, 0, 1, 0],   # n4
        [1, 0, 1, 0, 0, 0, 1],   # n5
    ], dtype=torch.bool)
    assert torch.equal(lay.mask, want)
    assert lay.children == [[0, 1], [2, 3], [5], [4], [], [], []]
    assert lay.paths() == [[0, 3], [0, 2, 4], [1, 5]]


def test_chain_layout_is_causal():
    lay = TreeLayout.from_parents([-1, 0, 1, 2])
    assert torch.equal(lay.mask, torch.ones(5, 5, dtype=torch.bool).tril())
    assert lay.depth.tolist() == [0, 1, 2, 3, 4]
    assert lay.paths() == [[0, 1, 2, 3]]
    assert is_chain([-1, 0, 1, 2]) and is_chain(None) and is_chain([])
    assert not is_chain(PARENTS) and not is_chain([-1, -1])


def test_empty_tree_is_just_a0():
    lay = TreeLayout.from_parents([])
    assert lay.depth.tolist() == [0] and lay.mask.tolist() == [[True]] and lay.paths() == []


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 0, 3], [-2]])
def test_bad_parents_are_refused(parents):
    with pytest.raises(ValueError, match="parent"):
        check_parents(parents)
    with pytest.raises(ValueError, match="parent"):
        TreeLayout.from_parents(parents)


def test_greedy_tree_verify_walks_the_agreeing_path():
    tokens = [5, 6, 7, 8, 9, 4]                    # n0..n5 under PARENTS
    lay = TreeLayout.from_parents(PARENTS)
    draft = Draft(tokens=tokens, parents=PARENTS)
    # row:        a0 n0 n1 n2 n3 n4 n5
    target = [5, 7, 0, 9, 0, 3, 0]                 # a0 -> n0 (5), n0 -> n2 (7), n2 -> n4 (9), bonus 3
    v = verify_tree_greedy(draft, lay, target)
    assert (v.accepted, v.path, v.next_token) == (3, [0, 2, 4], 3)
    assert v.emitted(draft) == [5, 7, 9, 3]
    target = [6, 0, 1, 0, 0, 0, 0]                 # a0 -> n1 (6), n1 wants 1, n5 has 4: correction 1
    v = verify_tree_greedy(draft, lay, target)
    assert (v.accepted, v.path, v.next_token) == (1, [1], 1)
    target = [2, 0, 0, 0, 0, 0, 0]                 # nothing agrees at the root
    v = verify_tree_greedy(draft, lay, target)
    assert (v.accepted, v.path, v.next_token) == (0, [], 2)
    assert lay.judged([]) == 1 and lay.judged([1]) == 2 and lay.judged([0, 2, 4]) == 3
    assert lay.judged([0, 3]) == 2             # a leaf: nothing judged past it


def test_duplicate_siblings_take_the_first():
    draft = Draft(tokens=[3, 3, 4], parents=[-1, -1, 1])
    v = verify_tree_greedy(draft, TreeLayout.from_parents(draft.parents), [3, 9, 4, 0])
    assert v.path == [0] and v.next_token == 9


def test_tree_verify_equals_chain_verify_on_chains():
    rng = random.Random(0)
    for _ in range(500):
        k = rng.randint(0, 8)
        target = [rng.randrange(4) for _ in range(k + 1)]
        tokens = [target[i] if rng.random() < 0.7 else rng.randrange(4) for i in range(k)]
        parents = list(range(-1, k - 1))
        chain = verify_greedy(Draft(tokens=tokens), target)
        tree = verify_tree_greedy(Draft(tokens=tokens, parents=parents), TreeLayout.from_parents(parents),
                                  target)
        assert (tree.accepted, tree.path, tree.next_token) == (chain.accepted, chain.path, chain.next_token)
        lay = TreeLayout.from_parents(parents)
        assert lay.judged(tree.path) == chain.accepted + (chain.accepted < k)


def test_verify_needs_one_target_row_per_node():
    draft = Draft(tokens=[1, 2], parents=[-1, -1])
    with pytest.raises(ValueError, match="N\\+1=3"):
        verify_tree_greedy(draft, TreeLayout.from_parents(draft.parents), [1, 2])


def test_truncated_keeps_a_valid_tree():
    draft = Draft(tokens=[5, 6, 7, 8, 9, 4], parents=PARENTS, probs=torch.rand(6, 10), drafter="x")
    cut = draft.truncated(4)
    assert cut.tokens == [5, 6, 7, 8] and cut.parents == [-1, -1, 0, 0] and cut.probs.shape == (4, 10)
    assert cut.drafter == "x"
    check_parents(cut.parents)
    assert draft.truncated(6) is draft
