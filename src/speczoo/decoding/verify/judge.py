"""The target's verdict on one round, from the logits of its verify forward: the one place that picks
the rule (greedy or rejection sampling, chain or tree), so the single engine (decoding/engine.py), the
continuous batch (decoding/batch.py) and the replays decide a sequence's tokens with the same lines.

Pure: it reads logits (and a grammar's masks of them) and the request's sampling parameters, draws
only from the generator it is handed, and never sees a model or a cache (the engine rolls the cache
back to what it returns).
"""

from __future__ import annotations

import torch
from torch import Tensor

from speczoo import sampling
from speczoo.request import SamplingParams
from speczoo.decoding.types import Draft, Verdict
from speczoo.decoding.verify.greedy import verify_greedy, verify_tree_greedy
from speczoo.decoding.verify.rejection import verify_sampling, verify_tree_sampling
from speczoo.decoding.verify.tree import TreeLayout


def judge(draft: Draft, logits: Tensor, params: SamplingParams, rng: torch.Generator | None,
          layout: TreeLayout | None = None, allowed: Tensor | None = None,
          penalty: Tensor | None = None) -> tuple[Verdict, int]:
    """The verdict on [a0] + draft, and how many draft tokens the target judged (a chain: all K; a
    tree: along its accepted path, TreeLayout.judged), which is what the controller's estimate counts.

    draft:  the round's draft, a chain of K tokens (layout None) or a tree of N nodes.
    logits: [S, V] the verify forward's logits, S = K + 1 (chain) or N + 1 (tree), row 0 = a0's.
    params: the request's sampling; greedy verifies on the argmax, else rejection sampling on
            sampling.probs(logits, params).
    rng:    the request's generator (None for greedy).
    layout: the tree's layout (None: a chain).
    allowed: [S, V] bool, a grammar's mask per row (decoding/constraint.py): the rule then judges on
            the logits with every forbidden token at -inf (None: unconstrained).
    penalty: [S, V] subtracted from the logits first (presence and frequency penalties per row,
            decoding/penalties.py; None: none).
    """
    if penalty is not None:
        logits = logits - penalty
    if allowed is not None:
        logits = sampling.masked(logits, allowed)
    if layout is None:
        if params.greedy:
            return verify_greedy(draft, logits.argmax(-1).tolist()), draft.k
        return verify_sampling(draft, sampling.probs(logits, params), rng), draft.k
    if params.greedy:
        verdict = verify_tree_greedy(draft, layout, logits.argmax(-1).tolist())
    else:
        verdict = verify_tree_sampling(draft, layout, sampling.probs(logits, params), rng)
    return verdict, layout.judged(verdict.path)


def kept_rows(verdict: Verdict, layout: TreeLayout | None = None) -> slice | Tensor:
    """The rows of the verify forward that the verdict commits: a0 and the accepted draft tokens
    (a chain: rows 0 .. accepted; a tree: row 0 and the accepted path's rows), oldest first."""
    if layout is None:
        return slice(0, 1 + verdict.accepted)
    return torch.tensor([0] + [1 + i for i in verdict.path])
