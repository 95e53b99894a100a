"""The EAGLE drafter: a trained EAGLE-3 head proposes from the target's own features.

The engine hands over, through `observe`, the target's hidden states at the head's three layers for
every position it commits (the prompt after the prefill, then [a0] + the accepted draft after each
round, whether this drafter drafted or not). The drafter keeps one row per committed position in
its head's KV cache — row t holds (feature of t, token at t + 1) — and feeds the rows it has not
fed yet at the start of each proposal. Drafting appends rows for draft tokens, which feed the head's
own output back in place of the target's feature; they are dropped (O(1) truncate) before `propose`
returns, so the head's cache always holds committed rows only and rolls back in step with the
target's without being told what was accepted.

Proposals:
  chain  K tokens, each the head's argmax (greedy) or a draw from its distribution mapped onto the
         target vocabulary (sampling; q returned for the verify rule); it stops early once the product
         of the head's probabilities for its tokens falls below the controller's floors (as the draft
         model does: the stop reads only the head's own numbers, so verification stays exact);
  tree   EAGLE-2's dynamic tree: expand the `branch` most probable nodes of each depth by their
         top-`branch` children (score = the path's summed log-probability), up to `depth`; the round's
         K nodes are the K best-scoring ones (a child never outscores its parent, so the tree stays
         connected and parents come first). Deterministic picks: no probs.
It never touches the target's cache and never decides acceptance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo import sampling
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.eagle.head import EagleHead
from speczoo.decoding.tuning import DRAFTING
from speczoo.decoding.types import MAX_K, Draft


@dataclass(frozen=True)
class TreeShape:
    depth: int = DRAFTING.eagle_tree_depth      # longest path proposed
    branch: int = DRAFTING.eagle_tree_branch    # children tried per expanded node, and nodes expanded per depth


@dataclass
class _Node:
    token: int              # target id
    score: float            # summed log-probability of the path root..node under the head
    parent: int             # pool index of the parent, -1: the root
    depth: int
    hidden: Tensor | None = None   # [1, D] the head's output at this node (once expanded)
    row: int = -1                  # its row in the head cache (once expanded)


class EagleDrafter(Drafter):
    name = "eagle"

    def __init__(self, head: EagleHead, cache, params: SamplingParams | None = None,
                 generator: torch.Generator | None = None, tree: TreeShape | None = None):
        self.head = head
        self.cache = cache                  # the head's one-layer KVCache
        self.params = params or SamplingParams()
        self.generator = generator
        self.tree = tree
        self.name = "eagle" if tree is None else "eagle-tree"
        self.stops_on_confidence = tree is None  # a chain stops when unsure; a tree ranks its nodes instead
        self.drafts_trees = tree is not None
        self.hidden_layers = head.cfg.target_layers
        self.d2t_ids = head.draft_to_target                 # [Vd] target id of each draft id
        self.vocab = head.cfg.target_vocab
        self.reset()

    def reset(self) -> None:
        self.cache.reset()
        self.pending: list[Tensor] = []     # [R, 3D] features observed, not yet fed to the head
        self.observed = 0                   # target positions whose features have arrived
        self.last: tuple[Tensor, Tensor] | None = None   # (hidden [1, D], logits [1, Vd]) of the last fed row
        self.steps = 0                      # head forwards (rows batches), for benches

    def observe(self, hidden: list[Tensor]) -> None:
        """hidden: the target's states [R, D] at each of `hidden_layers`, for R newly committed positions."""
        if len(hidden) != len(self.hidden_layers):
            raise ValueError(f"the EAGLE head reads {len(self.hidden_layers)} target layers "
                             f"{self.hidden_layers}; got {len(hidden)} hidden states")
        self.pending.append(torch.cat(hidden, dim=-1))     # [R, 3D]
        self.observed += hidden[0].shape[0]

    def prefill(self, prompt: list[int]) -> None:
        """Feed the prompt's rows while the target prefills (the engine hands over the prompt's features
        first), so the first proposal pays only for its own rows. The last prompt row waits for the
        first generated token."""
        if self.observed >= len(prompt) > 1:
            self._feed(prompt, len(prompt) - 1)

    def lag(self, context: list[int]) -> int:
        """Committed rows the head has not fed yet, beyond the last one (its catch-up after sitting out)."""
        return max(0, len(context) - 2 - self.cache.length) if context else 0

    def _feed(self, context: list[int], n: int) -> None:
        """Feed the head rows cache.length .. n - 1 (row t: feature of t, token context[t + 1])."""
        l0 = self.cache.length
        if l0 >= n:
            return
        feats = torch.cat(self.pending)                                      # [observed - l0, 3D]
        self.pending = [feats[n - l0:]] if self.observed > n else []
        tokens = torch.tensor(context[l0 + 1:n + 1], dtype=torch.long)
        out = self.head.step(tokens, self.head.fuse(feats[:n - l0]), torch.arange(l0 + 1, n + 1), self.cache)
        self.steps += 1
        self.last = (out.hidden[-1:], out.logits[-1:])

    def _catch_up(self, context: list[int]) -> int:
        """Feed the committed rows not in the head cache yet; returns n, the committed row count."""
        n = len(context) - 1
        if self.observed != n:
            raise RuntimeError(f"the EAGLE drafter holds target features for {self.observed} positions but the "
                               f"context commits {n}: the engine must pass the hidden states of every committed "
                               "position to observe()")
        self._feed(context, n)
        return n

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        n = self._catch_up(context)
        if n == 0 or k < 1:                      # no committed row yet: nothing to draft from
            return Draft(tokens=[], drafter=self.name)
        try:
            if self.tree is not None:
                return self._tree(n, k)
            return self._chain(n, k, floors)
        finally:
            self.cache.truncate(n)

    def _chain(self, n: int, k: int, floors: Sequence[float] = ()) -> Draft:
        hidden, logits = self.last
        tokens: list[int] = []
        qs: list[Tensor] = []
        said: list[float] = []              # the probability the head gave each token (with floors)
        sure = 1.0                          # their product so far
        for i in range(k):
            if self.params.greedy:
                j = int(logits[0].argmax())
                t = int(self.d2t_ids[j])
                p = float(torch.softmax(logits[0].float(), -1)[j]) if floors else 1.0
            else:
                q = sampling.probs(self._full(logits), self.params)           # [1, V]
                t = int(sampling.sample(q, self.generator)[0])
                qs.append(q[0])
                p = float(q[0, t])
            said.append(p)
            sure *= p
            tokens.append(t)
            if i + 1 < k and i < len(floors) and sure < floors[i]:
                break
            if i + 1 < k:
                out = self.head.step(torch.tensor([t]), hidden, torch.tensor([n + 1 + i]), self.cache)
                self.steps += 1
                hidden, logits = out.hidden, out.logits
        return Draft(tokens=tokens, probs=torch.stack(qs) if qs else None, drafter=self.name,
                     confidences=said if floors else None)

    def _full(self, logits: Tensor) -> Tensor:
        """Draft-vocabulary logits [S, Vd] -> target-vocabulary logits [S, V] (-inf outside the draft's)."""
        full = torch.full((logits.shape[0], self.vocab), float("-inf"))
        full[:, self.d2t_ids] = logits
        return full

    def _tree(self, n: int, budget: int) -> Draft:
        shape = self.tree
        pool: list[_Node] = []
        root_hidden, root_logits = self.last
        self._children(pool, -1, root_hidden, root_logits, 0.0, 1, shape.branch)
        frontier = list(range(len(pool)))
        for depth in range(2, shape.depth + 1):
            expand = sorted(frontier, key=lambda i: -pool[i].score)[:shape.branch]
            if not expand:
                break
            rows = len(expand)
            l0 = self.cache.length
            mask = torch.zeros(rows, l0 + rows, dtype=torch.bool)           # [R, L0 + R]
            mask[:, :n] = True                                              # the committed rows
            for r, i in enumerate(expand):
                mask[r, l0 + r] = True
                a = pool[i].parent
                while a >= 0:
                    mask[r, pool[a].row] = True
                    a = pool[a].parent
            tokens = torch.tensor([pool[i].token for i in expand])
            hidden = torch.cat([root_hidden if pool[i].parent < 0 else pool[pool[i].parent].hidden
                                for i in expand])                            # [R, D]
            out = self.head.step(tokens, hidden, torch.full((rows,), n + depth - 1), self.cache, mask=mask)
            self.steps += 1
            frontier = []
            for r, i in enumerate(expand):
                pool[i].hidden, pool[i].row = out.hidden[r:r + 1], l0 + r
                frontier += self._children(pool, i, out.hidden[r:r + 1], out.logits[r:r + 1], pool[i].score,
                                           depth, shape.branch)
        # the budget's best nodes; ties go to the shallower (earlier) node, so parents come first
        chosen = sorted(range(len(pool)), key=lambda i: (-pool[i].score, pool[i].depth, i))[:budget]
        order = {i: j for j, i in enumerate(chosen)}
        return Draft(tokens=[pool[i].token for i in chosen],
                     parents=[order[pool[i].parent] if pool[i].parent >= 0 else -1 for i in chosen],
                     drafter=self.name)

    def _children(self, pool: list[_Node], parent: int, hidden: Tensor, logits: Tensor, score: float, depth: int,
                  branch: int) -> list[int]:
        """Add the top-`branch` children of a node (its logits [1, Vd]) to the pool; return their indices."""
        logp = torch.log_softmax(logits[0].float(), dim=-1)                 # [Vd]
        top = torch.topk(logp, min(branch, logp.numel()))
        start = len(pool)
        for lp, d in zip(top.values.tolist(), top.indices.tolist()):
            pool.append(_Node(token=int(self.d2t_ids[d]), score=score + lp, parent=parent, depth=depth))
        return list(range(start, len(pool)))

    def commit(self, accepted: int) -> None:
        """Nothing to do: the accepted tokens' features arrive through `observe`."""


def make_eagle_drafter(head: EagleHead, max_seq: int, tree: TreeShape | None = None
                       ) -> Callable[[GenerationRequest], EagleDrafter]:
    """A factory the engine calls per request: one head cache, reused (reset) across requests."""
    from speczoo.cache import KVCache

    drafted_rows = MAX_K if tree is None else tree.depth * tree.branch    # rows a proposal appends, at most
    cache = KVCache(head.kv_args(), max_seq, extra=drafted_rows + 2)

    def factory(req: GenerationRequest) -> EagleDrafter:
        gen = None if req.sampling.greedy else sampling.make_generator(
            None if req.sampling.seed is None else req.sampling.seed + 2)
        return EagleDrafter(head, cache, req.sampling, gen, tree)

    return factory
