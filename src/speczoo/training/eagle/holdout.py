"""The head judged on chunks it never trained on, and its confidences calibrated there.

The training batches' top-1 agreement measures fit, not what drafting on new text will get (a head can
agree with its target on most of its training rows and on far fewer of a new prompt's: docs/eagle.md).
So one chunk of the feature cache in HOLDOUT_EVERY is kept out of
training (`train-eagle --holdout-every N`), and after training the head is run over those chunks (the
training-time test, no gradients) for its held-out top-1 agreement per step.

The same rows calibrate it. A head fitted to little data is overconfident on unseen text (its mean top-1
probability well above the share of its tokens that are right: docs/eagle.md), and its confidences decide
how far a chain drafts (the controller's floors, Tuning.stop_rate) and which nodes a tree keeps. `calibrate` divides the
LM head by the temperature that minimizes the held-out cross-entropy of all steps (temperature scaling):
the argmax, so every greedy proposal, is unchanged; the probabilities become honest; the head stays in
the speculators format. What calibration bought on a replay: docs/eagle.md. This module never runs the
target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from speczoo.training.eagle.features import FeatureSet
from speczoo.decoding.eagle.head import EagleHead
from speczoo.training.eagle.ttt import step_labels, unroll
from speczoo.training.eagle.vocab import t2d_index

HOLDOUT_EVERY = 20              # one chunk in this many is held out (0: none)
# Temperatures tried: 0.5 .. 4, evenly spaced in log (ratio ~1.05); 1.0 is among them.
TEMPERATURES = tuple(round(math.exp(math.log(0.5) + i * math.log(8.0) / 42), 4) for i in range(43))


def split(n: int, every: int = HOLDOUT_EVERY) -> tuple[list[int], list[int]]:
    """Chunk indices 0..n-1 for training and held out: the last chunk of every run of `every` is held out,
    so held-out chunks come from all along the cache (answers and corpus alike). None is held out when
    every is 0 or n < every."""
    if every < 0:
        raise ValueError(f"the held-out period must be >= 0 chunks (0: none), got {every}")
    if every == 0 or n < every:
        return list(range(n)), []
    held = [i for i in range(n) if i % every == every - 1]
    return [i for i in range(n) if i % every != every - 1], held


@dataclass
class HeldOut:
    rows: int                   # rows judged at step 0
    top1: list[float]           # per TTT step: top-1 agreement with the target
    confidence: list[float]     # per TTT step: mean probability of the head's own top-1 (after calibrating)
    temperature: float          # what the LM head was divided by (1.0: unchanged)

    def describe(self) -> str:
        return (f"held-out top-1 agreement by step {' / '.join(f'{a:.2f}' for a in self.top1)} over {self.rows} "
                f"rows (mean confidence {' / '.join(f'{c:.2f}' for c in self.confidence)} at temperature "
                f"{self.temperature:.2f})")

    def metadata(self) -> dict[str, str]:
        """For the saved head's safetensors metadata."""
        return {"heldout_rows": str(self.rows), "heldout_top1": ",".join(f"{a:.4f}" for a in self.top1),
                "temperature": f"{self.temperature:.4f}"}


@torch.no_grad()
def judge(head: EagleHead, data: FeatureSet, held: list[int], steps: int, batch: int = 4,
          device: str = "cpu") -> HeldOut | None:
    """The head's held-out agreement and best temperature over the chunks `held` (None if there are none).
    The head is not changed."""
    if not held:
        return None
    index = t2d_index(head.draft_to_target.cpu(), head.cfg.target_vocab)      # [V] draft id or -100
    hits, rows = [0] * steps, [0] * steps
    nll = torch.zeros(len(TEMPERATURES), dtype=torch.float64)                  # [G] summed over all steps
    conf = torch.zeros(steps, len(TEMPERATURES), dtype=torch.float64)          # [steps, G] summed top-1 probs
    was_training = head.training
    head.eval()
    try:
        for at in range(0, len(held), batch):
            feats, ids, top1 = data.get(held[at:at + batch])
            labels = index[top1].to(device)                                    # [B, L]
            out = unroll(head, feats.to(device), ids.to(device), labels, steps, keep_logits=True)
            for j, logits in enumerate(out.logits):                            # [B, T, Vd]
                lab = step_labels(labels, j)                                   # [B, T]
                valid = lab != -100
                lg, lb = logits[valid].float().cpu(), lab[valid].cpu()         # [N, Vd], [N]
                top, pred = lg.max(-1)                                         # [N], [N]
                right = lg.gather(1, lb[:, None])[:, 0]                        # [N]
                hits[j] += int((pred == lb).sum())
                rows[j] += int(lb.numel())
                for g, t in enumerate(TEMPERATURES):
                    lse = torch.logsumexp(lg / t, -1)                          # [N]
                    nll[g] += float((lse - right / t).sum())
                    conf[j, g] += float(torch.exp(top / t - lse).sum())
    finally:
        head.train(was_training)
    g = int(nll.argmin())
    return HeldOut(rows=rows[0], top1=[h / max(1, r) for h, r in zip(hits, rows)],
                   confidence=[float(conf[j, g]) / max(1, rows[j]) for j in range(steps)],
                   temperature=TEMPERATURES[g])


@torch.no_grad()
def calibrate(head: EagleHead, temperature: float) -> None:
    """Divide the head's LM head by `temperature` (its logits, so its softmax, at that temperature)."""
    if not temperature > 0:
        raise ValueError(f"a temperature must be > 0, got {temperature}")
    head.lm_head.weight.div_(temperature)
