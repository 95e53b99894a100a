"""How far an EAGLE head's drafts would run: replay it against the target's own greedy continuation.

The target's greedy output is known in advance (generated once) and one teacher-forced forward gives
its features at every position; the drafter then drafts every round, as the engine would with a
controller that never switches it off, and each round accepts what greedy verification would accept
(chain: the matching prefix; tree: the deepest node on the true path) plus the target's own next
token. No verify forwards are run, so a head is judged in seconds, independently of the controller and
of this machine's speed. The rounds are the engine's own (decoding/round.py), with the verify forward
stood in for by the known continuation. Arithmetic over ids and head steps only; it never touches a
target cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from speczoo.cache import KVCache
from speczoo.decoding.controller import Choice
from speczoo.decoding.drafters.eagle import EagleDrafter, TreeShape
from speczoo.decoding.eagle.head import EagleHead
from speczoo.decoding.round import Generation, RoundPlan, run_round, verify_recorded
from speczoo.decoding.types import Verdict
from speczoo.models.forward import LAST_ROW, Readout


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


class Always:
    """The policy of these replays: the one drafter, K tokens, every round (no floors, no fallback)."""

    def __init__(self, drafter: str, k: int):
        self.choice = Choice(drafter, k)

    def choose(self, lags: dict[str, int], situations: dict[str, str | None]) -> Choice:
        return self.choice

    def update(self, drafter: str, drafted: int, accepted: int, nodes: int = 0, path: Sequence[int] = (),
               confidences: Sequence[float] | None = None) -> None:
        pass


def replay(head: EagleHead, ids: list[int], hidden: list[Tensor], start: int, k: int,
           tree: TreeShape | None = None) -> ReplayResult:
    """ids: prompt + the target's greedy continuation; hidden: the target's states [N, D] at the head's
    layers for ids[:N] (one teacher-forced forward); start: the prompt length. A round starts with
    ids[:i] verified and ids[i] its a0 (the target's own pick), from i = start while a draft fits; the
    last a0 is left unverified, as the engine emits it without a round. The rounds are the engine's
    (decoding/round.py), verified against `ids`."""
    d = EagleDrafter(head, KVCache(head.kv_args(), len(ids) + k * (tree.depth * tree.branch if tree else 1) + 2),
                     tree=tree)
    d.observe([h[:start] for h in hidden])
    out = ids[start:]

    def verify(g: Generation, plan: RoundPlan) -> tuple[Verdict, int]:
        i = len(g.out)                              # out[i] is a0: the target chose it, not yet verified
        verdict, judged = verify_recorded(plan, out, i)
        d.observe([h[start + i:start + i + 1 + verdict.accepted] for h in hidden])
        return verdict, judged

    g = Generation({d.name: d}, Always(d.name, k), ids[:start], len(out))
    g.start(out[0])
    res = ReplayResult(0, 0, 0, 0)
    while g.remaining > 1:
        r = run_round(g, verify)
        res.rounds += 1
        res.drafted += r.drafted
        res.accepted += r.accepted
        res.tokens += len(r.ids)
    return res


def greedy_with_features(model, prompt: list[int], n: int, layers: tuple[int, ...]) -> tuple[list[int], list[Tensor]]:
    """The target's greedy continuation of `prompt` (n tokens, one decode step each), then one
    teacher-forced forward over everything for the features. Returns (ids, hidden [N, D] per layer)."""
    cache = KVCache(model.args, len(prompt) + n + 1)
    ids = list(prompt)
    with torch.no_grad():
        logits = model(torch.tensor(prompt), torch.arange(len(prompt)), cache, readout=LAST_ROW).logits
        for _ in range(n):
            ids.append(int(logits[-1].argmax()))
            logits = model(torch.tensor(ids[-1:]), torch.tensor([len(ids) - 1]), cache).logits
        cache.reset()
        out = model(torch.tensor(ids), torch.arange(len(ids)), cache,
                    readout=Readout(logit_rows=slice(-1, None), hidden_layers=layers))
    return ids, out.hidden
