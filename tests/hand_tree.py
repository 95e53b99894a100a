"""Token trees for tests: a hand-made tree after a prefix (its tokens, positions and mask, as the model
tests feed it) and a drafter that proposes random trees hiding the true continuation (test_models.py,
test_tree_engine.py, test_real_tree.py). Imported by test files, never a test itself."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.types import Draft

# A hand-made token tree after the prefix: parent of each node (-1: root), node tokens.
PARENT = [-1, 0, 0, 1, 2, 4, 4]
TREE_TOKENS = [5, 17, 99, 3, 42, 8, 64]


def tree_paths():
    """Each node's path from the root, as node indices."""
    paths = []
    for i in range(len(PARENT)):
        p, node = [], i
        while node >= 0:
            p.append(node)
            node = PARENT[node]
        paths.append(p[::-1])
    return paths


def tree_inputs(l0):
    """(tokens [S], positions [S], mask [S, S]) of the tree after a prefix of l0 tokens."""
    paths = tree_paths()
    s = len(PARENT)
    mask = torch.zeros(s, s, dtype=torch.bool)
    for i, p in enumerate(paths):
        mask[i, p] = True
    positions = torch.tensor([l0 + len(p) - 1 for p in paths])
    return torch.tensor(TREE_TOKENS), positions, mask


class ScriptedTree(Drafter):
    """Knows the target's greedy output; proposes a random tree of at most k nodes in which the true
    continuation runs for a random depth along a random branch, among wrong branches."""

    name = "tree"

    def __init__(self, truth: list[int], vocab: int, seed: int = 0):
        self.truth, self.vocab = truth, vocab
        self.rng = random.Random(seed)
        self.paths: list[list[int]] = []

    def reset(self) -> None:
        pass

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        rng = self.rng
        future = self.truth[len(context):]
        good = rng.randint(0, min(k, len(future)))          # how deep the true branch goes
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [-1]
        true_node = -1
        while len(tokens) < k and frontier:
            parent = rng.choice(frontier)
            depth = 0 if parent == -1 else self._depth(parents, parent) + 1
            if parent == true_node and depth < good and rng.random() < 0.5:
                tok = future[depth]
                true_node = len(tokens)
            else:
                tok = rng.randrange(self.vocab)
            tokens.append(tok)
            parents.append(parent)
            frontier.append(len(tokens) - 1)
        return Draft(tokens=tokens, parents=parents, drafter=self.name)

    @staticmethod
    def _depth(parents: list[int], node: int) -> int:
        d = 0
        while parents[node] != -1:
            node, d = parents[node], d + 1
        return d

    def commit(self, accepted: int) -> None:
        pass

    def commit_path(self, path: list[int]) -> None:
        self.paths.append(path)
