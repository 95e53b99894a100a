"""How far an EAGLE head's drafts would run: replay it against the target's own greedy continuation.

The target's greedy output is known in advance (generated once) and one teacher-forced forward gives
its features at every position; the drafter then drafts every round, as the engine would with a
controller that never switches it off, and each round accepts what greedy verification would accept
(chain: the matching prefix; tree: the deepest node on the true path) plus the target's own next
token. No verify forwards are run, so a head is judged in seconds, independently of the controller and
of this machine's speed. Arithmetic over ids and head steps only; it never touches a target cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.cache import KVCache
from speczoo.decoding.drafters.eagle import EagleDrafter, TreeShape
from speczoo.decoding.eagle.head import EagleHead


@dataclass
class ReplayResult:
    rounds: int
    drafted: int
    accepted: int
    tokens: int                      # tokens the rounds committed (a0 + accepted, per round)

    @property
    def accepted_per_round(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0


def replay(head: EagleHead, ids: list[int], hidden: list[Tensor], start: int, k: int,
           tree: TreeShape | None = None) -> ReplayResult:
    """ids: prompt + the target's greedy continuation; hidden: the target's states [N, D] at the head's
    layers for ids[:N] (one teacher-forced forward); start: the prompt length. A round starts with
    ids[:i] verified and ids[i] its a0 (the target's own pick), from i = start while a draft fits; the
    last a0 is left unverified, as the engine emits it without a round."""
    d = EagleDrafter(head, KVCache(head.kv_args(), len(ids) + k * (tree.depth * tree.branch if tree else 1) + 2),
                     tree=tree)
    i = start                                       # ids[i] is a0: the target chose it, not yet verified
    d.observe([h[:i] for h in hidden])
    res = ReplayResult(0, 0, 0, 0)
    while i + 1 < len(ids):
        kk = min(k, len(ids) - 1 - i)
        draft = d.propose(ids[:i + 1], kk)
        truth = ids[i + 1:i + 1 + kk]
        got = _accepted(draft.tokens, draft.parents, truth)
        res.rounds += 1
        res.drafted += draft.k
        res.accepted += got
        res.tokens += got + 1
        n = min(got + 1, len(ids) - 1 - i)          # a0 and the accepted tokens are committed now
        d.observe([h[i:i + n] for h in hidden])
        i += n
    return res


def _accepted(tokens: list[int], parents: list[int] | None, truth: list[int]) -> int:
    """Greedy verification against a known continuation: the longest root path that spells truth."""
    if parents is None:
        n = 0
        while n < min(len(tokens), len(truth)) and tokens[n] == truth[n]:
            n += 1
        return n
    depth_of: dict[int, int] = {-1: 0}
    best = 0
    for i, (t, p) in enumerate(zip(tokens, parents)):
        if p in depth_of and depth_of[p] < len(truth) and t == truth[depth_of[p]]:
            depth_of[i] = depth_of[p] + 1
            best = max(best, depth_of[i])
    return best


def greedy_with_features(model, prompt: list[int], n: int, layers: tuple[int, ...]) -> tuple[list[int], list[Tensor]]:
    """The target's greedy continuation of `prompt` (n tokens, one decode step each), then one
    teacher-forced forward over everything for the features. Returns (ids, hidden [N, D] per layer)."""
    cache = KVCache(model.args, len(prompt) + n + 1)
    ids = list(prompt)
    with torch.no_grad():
        logits = model(torch.tensor(prompt), torch.arange(len(prompt)), cache, logit_rows=slice(-1, None)).logits
        for _ in range(n):
            ids.append(int(logits[-1].argmax()))
            logits = model(torch.tensor(ids[-1:]), torch.tensor([len(ids) - 1]), cache).logits
        cache.reset()
        out = model(torch.tensor(ids), torch.arange(len(ids)), cache, hidden_layers=layers, logit_rows=slice(-1, None))
    return ids, out.hidden
