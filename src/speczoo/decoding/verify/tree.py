"""Token trees: the flattened verify input of a drafted tree (its rows, positions and attention mask).

A tree draft is `Draft(tokens, parents)` with parents[i] the index of node i's parent (-1: the root,
i.e. the pending token a0), every parent listed before its children. One target forward verifies the
whole tree: its S = N + 1 rows are [a0] + tokens (row 0 is a0, row i + 1 is node i), each row at
position base + depth (a0 at depth 0) and attending to the committed prefix, a0 and its own ancestors
only (the tree attention mask). Row r then holds the target's prediction for the token after the path
that ends at row r, so a node is checked against its parent's row, as a chain token d[i] is checked
against row i (decoding/verify/__init__.py); a chain is the tree whose parents are -1, 0, 1, ...

Pure: nothing here sees a model or a cache, and nothing mutates its inputs. The engine builds the
layout, runs the forward, verifies (greedy.py, rejection.py), then moves the accepted path's K/V rows
into place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def check_parents(parents: list[int]) -> None:
    """Raise ValueError unless every parent is -1 or an earlier node (a topologically ordered tree)."""
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"tree node {i} has parent {p}; a parent must be -1 (the root) or an earlier "
                             f"node (0..{i - 1}): list every parent before its children")


def is_chain(parents: list[int] | None) -> bool:
    """True for no tree at all and for the degenerate tree -1, 0, 1, ... (a chain)."""
    return parents is None or all(p == i - 1 for i, p in enumerate(parents))


@dataclass
class TreeLayout:
    """The flattened verify input of a tree of N nodes (S = N + 1 rows, row 0 = a0).

    depth:    [S] depth of each row (a0: 0, its children: 1, ...); positions are base + depth.
    mask:     [S, S] bool; mask[r, c] is True when row r may attend to row c (c is r or an ancestor of
              r, a0 included). The committed prefix is visible to every row and is not part of it.
    children: per row, the draft indices of its children in draft order.
    parents:  the draft's parents (node i's parent index, -1 for a0).
    """

    depth: Tensor
    mask: Tensor
    children: list[list[int]]
    parents: list[int]

    @classmethod
    def from_parents(cls, parents: list[int]) -> TreeLayout:
        check_parents(parents)
        s = len(parents) + 1
        rows = [[False] * s for _ in range(s)]                    # [S][S] built in Python, one tensor
        rows[0][0] = True
        depth = [0] * s
        children: list[list[int]] = [[] for _ in range(s)]
        for i, p in enumerate(parents):
            r, pr = i + 1, p + 1                                  # rows of the node and its parent
            rows[r] = rows[pr].copy()                             # the parent's ancestors (and a0)...
            rows[r][r] = True                                     # ...and itself
            depth[r] = depth[pr] + 1
            children[pr].append(i)
        return cls(depth=torch.tensor(depth, dtype=torch.long), mask=torch.tensor(rows, dtype=torch.bool),
                   children=children, parents=list(parents))

    def positions(self, base: int) -> Tensor:
        """[S] positions of the rows when the committed prefix holds `base` tokens (a0 goes at base)."""
        return base + self.depth

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path as draft indices, leaves in draft order."""
        out: list[list[int]] = []
        for r in range(1, len(self.children)):
            if not self.children[r]:
                path, node = [], r - 1
                while node >= 0:
                    path.append(node)
                    node = self.parents[node]
                out.append(path[::-1])
        return out

    def judged(self, path: list[int]) -> int:
        """Draft tokens the target judged along the accepted path: the accepted ones, plus one miss
        when the last accepted node (or a0) had children, none of them accepted. A chain of K with a
        accepted gives a + [a < K], the count the controller's acceptance estimate expects."""
        last = path[-1] + 1 if path else 0
        return len(path) + (1 if self.children[last] else 0)
