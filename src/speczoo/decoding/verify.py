"""Pure verification: (draft, what the target computed) -> Verdict.

Never sees a model or a cache and never mutates its inputs; the engine acts on the verdict.
Indexing convention for a chain of K draft tokens d[0..K-1] verified by one target forward over
[a0] + d (S = K + 1 rows): row i holds the target's prediction for the token after d[i-1]
(row 0: after a0), so draft token d[i] is checked against row i, and the token the target adds
itself is row `accepted` (the correction at the first miss, or the bonus when all K agree).
"""

from __future__ import annotations

from speczoo.decoding.types import Draft, Verdict


def verify_greedy(draft: Draft, target_ids: list[int]) -> Verdict:
    """Greedy chain verification.

    target_ids: [K + 1] the target's argmax at each row of the verify forward.
    """
    k = draft.k
    if len(target_ids) != k + 1:
        raise ValueError(f"verify_greedy needs K+1={k + 1} target ids, got {len(target_ids)}")
    accepted = 0
    while accepted < k and draft.tokens[accepted] == target_ids[accepted]:
        accepted += 1
    return Verdict(accepted=accepted, next_token=target_ids[accepted], path=list(range(accepted)))
