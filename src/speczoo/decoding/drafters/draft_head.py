"""A reduced-vocabulary LM head for a draft model: cheaper proposals, unchanged output.

A draft step of a small model spends a large share of its weight reads on the LM head (151,936 rows
for Qwen2.5). For drafting, the head only has to rank the tokens the target is likely to say next, so
it keeps
  * the first `n_common` ids (byte-level BPE ids are in merge order, so the low ids are the frequent
    ones; how much of a text they cover: docs/results.md, Drafting.head_vocab in docs/tuning.md), and
  * the prompt's own rarer ids (identifiers, names a conversation uses), with the 16-row strips of the
    head that hold them,
both computed by the model's own compiled head over just those rows (the same arithmetic as the full
head), and gives every other id a logit of -inf. The target still verifies over its full vocabulary, so
the output is exactly what it would be without drafting; a token the reduced head cannot propose only
costs acceptance. Sampling stays lossless too: q is a proper distribution over the full vocabulary that
is zero outside the kept ids, and the verify rule needs nothing more. This module never touches a cache.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from speczoo.decoding.tuning import DRAFTING
from speczoo.kernels.pack import STRIP
from speczoo.kernels.quantized import is_compiled, select_strips


class ReducedHead(nn.Module):
    """logits [R, V] for final-normed rows h [R, D]: real logits for the kept ids, -inf elsewhere."""

    def __init__(self, model, n_common: int):
        super().__init__()
        self.model_head = model.lm_head
        self.vocab = model.args.vocab_size
        n_common = min(n_common, self.vocab) // STRIP * STRIP
        self.common = select_strips(model.lm_head, torch.arange(n_common // STRIP)) if n_common else None
        if self.common is None:
            raise ValueError(f"a reduced draft head needs a compiled q4/q8 LM head and at least {STRIP} "
                             f"common ids; got {type(model.lm_head).__name__} and {n_common}")
        self.n_common = n_common
        self.extra: nn.Module | None = None       # the strips of the prompt's rarer ids
        self.extra_cols = torch.zeros(0, dtype=torch.long)

    @classmethod
    def for_model(cls, model, n_common: int | None) -> ReducedHead | None:
        """The reduced head a draft model proposes from, or None when it keeps its full head: no
        `n_common` given, a vocabulary no larger than it, or an LM head that is not a compiled kernel."""
        if n_common is None or n_common >= model.args.vocab_size or not is_compiled(model.lm_head):
            return None
        return cls(model, n_common)

    def keep(self, ids: list[int]) -> None:
        """Also score these ids (a prompt's) past the common block: the head strips that hold them."""
        full = self.vocab // STRIP                  # whole strips only (a partial last one is left out)
        strips = sorted({i // STRIP for i in ids if self.n_common <= i < self.vocab and i // STRIP < full})
        strips = strips[:DRAFTING.head_extra_strips]
        if not strips:
            self.extra, self.extra_cols = None, torch.zeros(0, dtype=torch.long)
            return
        st = torch.tensor(strips, dtype=torch.long)
        self.extra = select_strips(self.model_head, st)
        self.extra_cols = (st[:, None] * STRIP + torch.arange(STRIP)).flatten()     # [E] ids, E = 16 * strips

    def pick(self, row: Tensor) -> tuple[int, Tensor]:
        """The argmax of one row [V] of this head's logits, looked for among the kept ids only (the same
        id: every other logit is -inf and the kept ids are in increasing order, so ties resolve alike),
        and the kept logits [n_common + E], whose softmax gives the pick's probability as the full row's
        would, at a fraction of the argmax and softmax of the whole row."""
        kept = row[: self.n_common] if self.extra is None else torch.cat((row[: self.n_common], row[self.extra_cols]))
        j = int(kept.argmax())
        return (j if j < self.n_common else int(self.extra_cols[j - self.n_common])), kept

    def forward(self, h: Tensor) -> Tensor:  # h: [R, D] -> [R, V]
        out = torch.full((h.shape[0], self.vocab), -torch.inf)
        out[:, : self.n_common] = self.common(h)
        if self.extra is not None:
            out[:, self.extra_cols] = self.extra(h)                          # [R, E]
        return out
