"""Training-time test: the head unrolled on its own hidden states, batched over whole chunks.

EAGLE-3 trains the head the way it is used: step 0 reads the target's fused features; step j > 0
reads the head's own step j - 1 output in their place, so that errors compound in training as they
will when drafting several tokens ahead. For row t (target position t) at step j:
  input token   ids[t + 1 + j]      (the token at position t + 1 + j)
  position      t + 1 + j
  label         top1[t + 1 + j]     (the target's greedy prediction there, as a draft id)
  attention     step-0 rows 0..t (the committed prefix) plus row t of steps 1..j (its own draft chain),
which is exactly what `EagleHead.step` sees when it drafts j + 1 tokens after committed row t.
Pure function of the head and a batch; no optimizer, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from speczoo.decoding.eagle.head import EagleHead, rotate


@dataclass
class TTTOut:
    loss: Tensor            # scalar: decay-weighted mean of the per-step cross-entropies
    losses: list[float]     # per step
    acc: list[float]        # per step: top-1 agreement with the target over labelled rows
    logits: list[Tensor] | None = None   # per step [B, T, Vd] when asked for (tests)


def ttt_attention(q: Tensor, ks: list[Tensor], vs: list[Tensor]) -> Tensor:
    """q: [B, H, T, Dh] (rotated); ks, vs: per step so far [B, Hkv, T, Dh]. Row t attends causally to
    step 0's rows 0..t and to its own row in every later step. Returns [B, H, T, Dh]."""
    b, h, t, dh = q.shape
    g = h // ks[0].shape[1]
    k = [x.repeat_interleave(g, dim=1) for x in ks]                       # [B, H, T, Dh] each
    v = [x.repeat_interleave(g, dim=1) for x in vs]
    scale = dh ** -0.5
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()   # [T, T]
    s0 = (q @ k[0].transpose(-1, -2)) * scale                             # [B, H, T, T]
    s0 = s0.masked_fill(~causal, float("-inf"))
    own = [((q * kj).sum(-1) * scale)[..., None] for kj in k[1:]]        # [B, H, T, 1] each
    w = torch.softmax(torch.cat([s0, *own], dim=-1), dim=-1)              # [B, H, T, T + j]
    out = w[..., :t] @ v[0]                                               # [B, H, T, Dh]
    for i, vj in enumerate(v[1:]):
        out = out + w[..., t + i, None] * vj
    return out


def step_labels(labels: Tensor, j: int) -> Tensor:
    """labels: [B, L] draft ids of the target's top-1 per position -> [B, L - 1] the labels of step j's rows
    (row t: the label at position t + 1 + j; -100 past the chunk's end)."""
    seq = labels.shape[1]
    src = torch.arange(seq - 1, device=labels.device) + 1 + j                # [T]
    return labels[:, src.clamp(max=seq - 1)].masked_fill(src >= seq, -100)


def unroll(head: EagleHead, features: Tensor, ids: Tensor, labels: Tensor, steps: int,
           decay: float = 0.8, keep_logits: bool = False) -> TTTOut:
    """features: [B, L, 3D] target features; ids: [B, L] chunk tokens; labels: [B, L] draft ids of the
    target's top-1 at each position (-100: outside the draft vocabulary). Rows t = 0..L-2."""
    b, seq = ids.shape
    t = seq - 1
    if t < 1 or steps < 1:
        raise ValueError(f"the training-time test needs chunks of >= 2 tokens and >= 1 step; got L={seq}, "
                         f"steps={steps}")
    layer = head.layers[0]
    hid = head.fuse(features[:, :t])                                       # [B, T, D]
    rows = torch.arange(t, device=ids.device)                              # [T]
    ks: list[Tensor] = []
    vs: list[Tensor] = []
    total = torch.zeros((), device=features.device)
    weights = 0.0
    losses, accs = [], []
    kept: list[Tensor] = []
    for j in range(steps):
        src = rows + 1 + j                                                 # [T] position of the input token
        tok = ids[:, src.clamp(max=seq - 1)]                               # [B, T]
        lab = step_labels(labels, j)                                       # [B, T]
        q, k, v = layer.project(head.embed[tok], hid)                      # [B, T, H, Dh], [B, T, Hkv, Dh] x2
        cos, sin = head.rope(src)                                          # [T, 1, Dh]
        ks.append(rotate(k, cos, sin).transpose(1, 2))                     # [B, Hkv, T, Dh]
        vs.append(v.transpose(1, 2))
        attn = ttt_attention(rotate(q, cos, sin).transpose(1, 2), ks, vs)  # [B, H, T, Dh]
        hid = layer.finish(attn.transpose(1, 2).reshape(b, t, -1), hid)    # [B, T, D]
        logits = head.lm_head(head.norm(hid))                              # [B, T, Vd]
        if keep_logits:
            kept.append(logits.detach())
        valid = lab != -100
        if bool(valid.any()):
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1), ignore_index=-100)
            acc = float((logits.argmax(-1) == lab)[valid].float().mean())
        else:
            ce, acc = logits.sum() * 0.0, 0.0
        w = decay ** j
        total = total + w * ce
        weights += w
        losses.append(float(ce.detach()))
        accs.append(acc)
    return TTTOut(loss=total / weights, losses=losses, acc=accs, logits=kept if keep_logits else None)
