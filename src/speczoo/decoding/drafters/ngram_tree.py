"""Prompt lookup as a token tree: the continuations of several earlier matches, merged into a prefix tree.

Where plain prompt lookup (ngram.py) copies what followed one occurrence of the longest matching suffix
(of its recent occurrences, the one whose match reaches furthest back), this drafter gathers the
continuations of up to `max_matches` occurrences at every order from max_order down to min_order, ranked
per order as the chain picks (so the tree holds the chain; an occurrence found at a higher order is
counted once, at that order), and merges them into a trie. Each candidate carries a weight,
order_weight^m / (1 + r) for a match that reaches m ids back (its order n, or further up to
Drafting.lookup_reach, as the chain measures it) and is the r-th best at its order: the occurrence that
continues the passage being copied outweighs those that merely end alike, so the tree follows the chain
deep and branches where matches tie (was order_weight^n: the chain's depth was cut for siblings a long
match did not need, docs/results.md "Prompt-lookup trees inside `auto`"); a trie node's
score is its parent's score × decay × (the weight of the candidates through it / the weight through its
parent), the probability that the target follows it under a crude model where each step of a path is
right with probability `decay` and the candidates vote. The round's K nodes are the K best-scoring nodes, expanded
best first from the root (EAGLE-2's rule; a child never outscores its parent, so every parent is chosen
before its children and the tree stays connected). When every candidate agrees the tree is a chain,
and the engine verifies it as one.

The index (ngram.py's NgramIndex) keeps every occurrence of every n-gram (one entry per order per
committed token), updated incrementally; a round costs O(orders × (window × reach + max_matches × K)). It never sees the
target model.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from speczoo.decoding.drafters.ngram import NgramIndex, PromptLookup
from speczoo.decoding.tuning import DRAFTING
from speczoo.decoding.types import Draft


@dataclass
class Candidate:
    tokens: list[int]       # the continuation, K tokens
    weight: float


def candidates(index: NgramIndex, k: int, max_matches: int, order_weight: float) -> list[Candidate]:
    """The k-token continuations of the suffix's best matches in `index`, best first: per order, of its
    Drafting.agree_window most recent occurrences, those whose match reaches furthest back (up to
    Drafting.lookup_reach; ties: the latest), as the chain's lookup picks (ngram.py `pick`), so the tree
    holds the chain; an occurrence already found at a higher order is counted once, at that order."""
    seen: set[int] = set()
    out: list[Candidate] = []
    for n in range(index.max_order, index.min_order - 1, -1):
        ranked = [s for s in index.ranked(index.matches(n)) if s not in seen]
        for rank, start in enumerate(ranked[:max_matches]):
            seen.add(start)
            reach = max(n, index.match_length(start, DRAFTING.lookup_reach))
            out.append(Candidate(index.continuation(start, k), order_weight ** reach / (1 + rank)))
    return out


def merge(candidates: list[Candidate], budget: int, decay: float) -> tuple[list[int], list[int]]:
    """The `budget` best nodes of the candidates' prefix tree: (tokens, parents), parents first."""
    # trie: node id -> token, parent id, weight through it; children per node keyed by token
    token: list[int] = []
    parent: list[int] = []
    weight: list[float] = []
    kids: dict[int, dict[int, int]] = {-1: {}}
    for cand in candidates:
        node = -1
        for t in cand.tokens:
            child = kids[node].get(t)
            if child is None:
                child = len(token)
                token.append(t)
                parent.append(node)
                weight.append(0.0)
                kids[node][t] = child
                kids[child] = {}
            weight[child] += cand.weight
            node = child
    total = sum(c.weight for c in candidates)
    tokens: list[int] = []
    parents: list[int] = []
    out_index: dict[int, int] = {-1: -1}            # trie id -> index in the draft
    heap = [(-decay * weight[c] / total, c) for c in kids[-1].values()]
    heapq.heapify(heap)
    while heap and len(tokens) < budget:
        neg, node = heapq.heappop(heap)
        out_index[node] = len(tokens)
        tokens.append(token[node])
        parents.append(out_index[parent[node]])
        for c in kids[node].values():
            heapq.heappush(heap, (neg * decay * weight[c] / weight[node], c))
    return tokens, parents


class NgramTreeDrafter(PromptLookup):
    """Prompt lookup proposing a token tree of at most K nodes (K: the round's draft budget). Its
    situation priors are the chain's (the controller starts its a(N) estimates from them,
    decoding/tree_acceptance.py). Its tree of K nodes is the first K nodes of its tree of more (best-first
    expansion; the candidates' ranking does not depend on K), which is what lets one round's accepted path
    price every smaller budget."""

    name = "ngram-tree"
    drafts_trees = True

    def __init__(self, max_order: int = 3, min_order: int = 1, max_matches: int = DRAFTING.tree_matches,
                 order_weight: float = DRAFTING.tree_order_weight, decay: float = DRAFTING.tree_decay):
        if max_matches < 1:
            raise ValueError(f"max_matches must be >= 1, got {max_matches}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        if not order_weight >= 1.0:
            raise ValueError(f"order_weight must be >= 1, got {order_weight}")
        super().__init__(max_order, min_order)
        self.max_matches, self.order_weight, self.decay = max_matches, order_weight, decay

    def branches(self, context: list[int]) -> bool:
        """Whether the suffix's recent occurrences continue with different tokens (NgramIndex.branches).
        Where they agree, the tree starts with the chain's next token: a sibling of it could only come from a
        shorter match, which weighs less than the chain's own (order_weight per id of reach)."""
        self.index.follow(context)
        return self.index.branches()

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        self.index.follow(context)
        cands = candidates(self.index, k, self.max_matches, self.order_weight)
        if not cands or k < 1:
            return Draft(tokens=[], drafter=self.name)
        tokens, parents = merge(cands, k, self.decay)
        return Draft(tokens=tokens, parents=parents, drafter=self.name)
