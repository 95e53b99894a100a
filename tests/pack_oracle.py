"""The packers as they were before they were made fast, kept verbatim as the oracles of kernels/pack.py:
a packing is stored in bundles, so the fast packers must give these functions' bytes exactly, on every
weight (tests/kernels/test_pack_oracle.py holds them to it). Never change these to make a test pass.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speczoo.kernels.pack import GROUP, Q8_KALIGN, STRIP, SUPER, Q4Codes, _meta, _round_up, pack_q4_codes

_ROW_CHUNK = 2048


def _check_weight(weight: Tensor) -> Tensor:
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] == 0:
        raise ValueError(f"a linear weight must be 2-D [N, K] with N, K > 0, got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    if not torch.isfinite(w).all():
        raise ValueError("the weight has NaN or inf values; quantizing it would hide that, fix the source")
    return w.contiguous()


def old_quantize_q8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-column int8: returns q int8 [N, K] in [-127, 127] and scale fp32 [N]."""
    w = _check_weight(weight)                                   # [N, K]
    scale = w.abs().amax(dim=1) / 127.0                         # [N]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / safe[:, None]).clamp_(-127, 127)
    q = torch.where(scale[:, None] > 0, q, torch.zeros_like(q)).to(torch.int8)
    return q, scale


def old_pack_q8(weight: Tensor) -> dict[str, Tensor]:
    """{"w8": u8 [NB, KP/4, 16, 4] (q + 128), "sw": f32 [NB*16], "meta": i64 [N, K]}."""
    q, scale = old_quantize_q8(weight)
    n, k = q.shape
    np_, kp = _round_up(n, STRIP), _round_up(k, Q8_KALIGN)
    qp = torch.zeros(np_, kp, dtype=torch.int16)
    qp[:n, :k] = q.to(torch.int16)
    w8 = (qp + 128).to(torch.uint8)                             # [NP, KP]
    w8 = w8.view(np_ // STRIP, STRIP, kp // 4, 4).permute(0, 2, 1, 3).contiguous()
    sw = torch.zeros(np_, dtype=torch.float32)
    sw[:n] = scale
    return {"w8": w8, "sw": sw, "meta": _meta(n, k)}


def _group_err(w: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Best codes and squared error of each group for w ~ a*q - b. w: [R, G, 32]; a, b: [R, G]."""
    a3, b3 = a[..., None], b[..., None]
    safe = torch.where(a3 > 0, a3, torch.ones_like(a3))
    q = torch.round((w + b3) / safe).clamp_(0, 15)
    q = torch.where(a3 > 0, q, torch.zeros_like(q))
    diff = (a3 * q - b3 - w).double()
    err = (diff * diff).sum(-1)                                                      # [R, G] fp64
    return q, err


def _group_steps(wg: Tensor) -> tuple[Tensor, Tensor]:
    """Per-group min offset b >= 0 and the best continuous step a (the top code may sit at 12..15).

    wg: [R, G, 32] -> a, b: [R, G]. Searching the top code finds the exact grid of Q4_K data, whose
    groups do not always use code 15, and clips outliers of other data.
    """
    gmin = wg.amin(-1).clamp(max=0.0)
    span = wg.amax(-1) - gmin                                                        # [R, G]
    bmin = -gmin
    best_a, best_e = span / 15.0, None
    for top in (15.0, 14.0, 13.0, 12.0):
        a = span / top
        _, e = _group_err(wg, a, bmin)
        if best_e is None:
            best_e = e
        else:
            better = e < best_e
            best_a, best_e = torch.where(better, a, best_a), torch.where(better, e, best_e)
    return best_a, bmin


def _q4_rows(wg: Tensor, best_a: Tensor, bmin: Tensor, levels: int) -> tuple[Q4Codes, Tensor]:
    """Integer sub-scales in [0, levels] for groups wg [R, G, 32]; codes and per-super-block error [R, KB]."""
    r, ng, _ = wg.shape
    g8 = best_a.view(r, -1, 8)                                                       # [R, KB, 8]
    d = g8.amax(-1) / levels                                                         # [R, KB]
    dm = bmin.view(r, -1, 8).amax(-1) / levels
    dsafe = torch.where(d > 0, d, torch.ones_like(d))[:, :, None]
    dmsafe = torch.where(dm > 0, dm, torch.ones_like(dm))[:, :, None]
    m = torch.round(bmin.view(r, -1, 8) / dmsafe).clamp_(0, levels)
    b_q = (dm[:, :, None] * m).view(r, -1)                                           # [R, G]
    sc0 = torch.round(g8 / dsafe)
    best_sc, best_e, best_q = None, None, None
    for delta in (0.0, -1.0, 1.0):
        sc = (sc0 + delta).clamp_(0, levels)
        a_q = (d[:, :, None] * sc).view(r, -1)
        q, e = _group_err(wg, a_q, b_q)
        if best_e is None:
            best_sc, best_e, best_q = sc, e, q
        else:
            better = e < best_e
            best_sc = torch.where(better.view(r, -1, 8), sc, best_sc)
            best_q = torch.where(better[..., None], q, best_q)
            best_e = torch.where(better, e, best_e)
    codes = Q4Codes(
        q=best_q.reshape(r, ng * GROUP).to(torch.uint8),
        sc=best_sc.reshape(r, -1).to(torch.uint8),
        m=m.reshape(r, -1).to(torch.uint8),
        d=d.contiguous(),
        dm=dm.contiguous(),
    )
    return codes, best_e.view(r, -1, 8).sum(-1)


def old_quantize_q4(weight: Tensor) -> Q4Codes:
    """4-bit super-block quantization of w [N, K] (K zero-padded to a multiple of 256)."""
    w = _check_weight(weight)
    n, k = w.shape
    kp = _round_up(k, SUPER)
    parts: list[Q4Codes] = []
    for r0 in range(0, n, _ROW_CHUNK):
        rows = torch.zeros(min(_ROW_CHUNK, n - r0), kp, dtype=torch.float32)
        rows[:, :k] = w[r0:r0 + _ROW_CHUNK]
        wg = rows.view(rows.shape[0], kp // GROUP, GROUP)                            # [R, G, 32]
        best_a, bmin = _group_steps(wg)
        c63, e63 = _q4_rows(wg, best_a, bmin, 63)      # Q4_K's grid: exact on weights that came from Q4_K
        c255, e255 = _q4_rows(wg, best_a, bmin, 255)   # finer sub-scales: better on anything else
        take = (e255 < e63)                                                          # [R, KB]
        tg = take.repeat_interleave(8, dim=1)                                        # [R, G]
        parts.append(Q4Codes(
            q=torch.where(tg.repeat_interleave(GROUP, dim=1), c255.q, c63.q),
            sc=torch.where(tg, c255.sc, c63.sc),
            m=torch.where(tg, c255.m, c63.m),
            d=torch.where(take, c255.d, c63.d),
            dm=torch.where(take, c255.dm, c63.dm),
        ))
    return Q4Codes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "sc", "m", "d", "dm")))


def old_pack_q4(weight: Tensor) -> dict[str, Tensor]:
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    return pack_q4_codes(old_quantize_q4(weight), n, k)
