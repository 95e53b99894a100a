"""Greedy verification, chain and tree: (draft, the target's argmax per row) -> Verdict.

Under greedy decoding the target's own token at each row is its argmax, so a draft token is accepted
exactly when it equals the argmax of the row that predicts it (rows: see decoding/verify/__init__.py).
The emitted tokens are therefore plain greedy decoding's, whatever the drafter proposed.

Pure: never sees a model or a cache and never mutates its inputs.
"""

from __future__ import annotations

from speczoo.decoding.types import Draft, Verdict
from speczoo.decoding.verify.tree import TreeLayout


def verify_greedy(draft: Draft, target_ids: list[int]) -> Verdict:
    """Greedy chain verification: the longest prefix of the draft that matches the target's argmax,
    then the target's argmax at the first miss (the correction) or after the last token (the bonus).

    draft:      a chain of K tokens (Draft.parents None).
    target_ids: [K + 1] the target's argmax at each row of the verify forward over [a0] + draft.
    """
    k = draft.k
    if len(target_ids) != k + 1:
        raise ValueError(f"verify_greedy needs K+1={k + 1} target ids, got {len(target_ids)}")
    accepted = 0
    while accepted < k and draft.tokens[accepted] == target_ids[accepted]:
        accepted += 1
    return Verdict(accepted=accepted, next_token=target_ids[accepted], path=list(range(accepted)))


def verify_tree_greedy(draft: Draft, layout: TreeLayout, target_ids: list[int]) -> Verdict:
    """Greedy tree verification: from a0, step to the child whose token is the target's argmax at the
    current row, as long as there is one; the target's argmax at the last row reached is the
    correction (the node had children, none right) or the bonus (a leaf was reached).

    draft:      a token tree of N nodes (Draft.parents set).
    layout:     its TreeLayout (N + 1 rows, row 0 = a0).
    target_ids: [N + 1] the target's argmax at each row of the tree forward.
    """
    n = draft.k
    if len(target_ids) != n + 1 or len(layout.children) != n + 1:
        raise ValueError(f"verify_tree_greedy needs N+1={n + 1} target ids and layout rows, got "
                         f"{len(target_ids)} and {len(layout.children)}")
    path: list[int] = []
    row = 0
    while True:
        want = target_ids[row]
        nxt = next((c for c in layout.children[row] if draft.tokens[c] == want), None)
        if nxt is None:
            return Verdict(accepted=len(path), next_token=want, path=path)
        path.append(nxt)
        row = nxt + 1
