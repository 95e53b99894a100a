"""The short-convolution block of a hybrid model (LFM2's "conv" layers), and which earlier rows each row's
convolution reads.

A block: h = norm(x); B, C, u = split(in_proj(h)); y = out_proj(C * conv(B * u)); x + y, then the gated MLP
as in an attention block. conv is depthwise and causal over L taps: row t's output is
sum_k w[:, k] * v[t - W + k] (W = L - 1, v = B * u), added up in k order, one elementwise product and sum
per tap over [S, D]; every row's value comes from its own window by the same operations whatever S is, so
the block is batch-invariant when its linears are. The inputs v of earlier rows come from the cache's
ConvRows (models/conv_rows.py), named by cache slot: `predecessors` gives, for a chain, a token tree or
rows of several sequences, the slots of each row's W predecessors on its own path. Never touches K/V.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from speczoo.kernels.attention import KeyRows
from speczoo.kernels.linear import LinearBackend
from speczoo.models.args import ModelArgs
from speczoo.models.base import Mlp, RMSNorm, make_linear
from speczoo.models.conv_rows import ConvPlan, ConvRows
from speczoo.models.decoder import Layout, SplitLinear, _projections
from speczoo.models.forward import Attend, Packed, Tree

IN_PROJ, CONV, OUT_PROJ = "shortconv.in_proj", "shortconv.conv", "shortconv.out_proj"


class ShortConvBlock(nn.Module):
    sliding = False          # no attention: what the decoder's RoPE and key plans are chosen by
    native = None            # never one compiled call (models/decoder.py NativeStack)

    def __init__(self, layout: Layout, args: ModelArgs, i: int, tensors: Mapping[str, Tensor],
                 backend: LinearBackend, packed: Mapping[str, Tensor] | None):
        super().__init__()
        p, d = f"blk.{i}.", args.dim
        self.attn_norm = RMSNorm(tensors[f"{p}{layout.attn_norm}.weight"], args.norm_eps)
        self.in_proj = SplitLinear(make_linear(f"{p}{IN_PROJ}.weight", tensors, backend, packed), [d, d, d])
        taps = tensors[f"{p}{CONV}.weight"].float()                        # [D, L] as the GGUF holds it
        if taps.shape != (d, args.conv_kernel):
            raise ValueError(f"{p}{CONV}.weight is {tuple(taps.shape)}, not [{d}, {args.conv_kernel}] (dim, taps); "
                             "the file is inconsistent")
        self.taps = taps.t().contiguous()                                  # [L, D]
        self.out_proj = make_linear(f"{p}{OUT_PROJ}.weight", tensors, backend, packed)
        self.ffn_norm = RMSNorm(tensors[f"{p}{layout.ffn_norm}.weight"], args.norm_eps)
        gate_up = _projections(p, layout.gate_up, [args.ffn_dim] * 2, tensors, backend, packed, False)
        self.mlp = Mlp(gate_up, make_linear(f"{p}{layout.down}.weight", tensors, backend, packed), args.act)

    def forward(self, x: Tensor, rows: ConvRows, layer: int, plan: ConvPlan) -> Tensor:  # x: [S, D] -> [S, D]
        b, c, u = self.in_proj(self.attn_norm(x))                          # [S, D] each
        v = b * u
        window = rows.window(layer, v, plan)                               # [W, S, D] oldest first
        y = self.taps[0] * window[0]
        for k in range(1, window.shape[0]):
            y = y + self.taps[k] * window[k]
        y = y + self.taps[-1] * v
        rows.store(layer, v, plan)
        x = x + self.out_proj(c * y)
        return x + self.mlp(self.ffn_norm(x))


def predecessors(attend: Attend, at: int | Tensor, n: int, width: int) -> tuple[list[list[int]], list[int]]:
    """(prev, dest): the cache slots of each row's W predecessors on its own path, oldest first (-1 before
    its sequence's start), and the slot each row is written to. A chain's rows follow the prefix [0, at); a
    tree row follows the prefix, then its ancestors; a Packed row follows the key slots it attends to
    before its own (its sequence's, in order)."""
    if isinstance(attend, Packed):
        dest = attend.dest.tolist()
        return _from_keys(attend.keys, dest, width), dest
    l0 = int(at)
    dest = list(range(l0, l0 + n))
    if not isinstance(attend, Tree):
        return [[max(-1, s - width + k) for k in range(width)] for s in dest], dest
    prefix = list(range(max(0, l0 - width), l0))
    return [_last(prefix + (l0 + attend.mask[i, :i].nonzero().flatten()).tolist(), width) for i in range(n)], dest


def _from_keys(keys: KeyRows, dest: list[int], width: int) -> list[list[int]]:
    """Each row's W key slots before its last, which must be the row's own slot (Packed rows of slots.py)."""
    lo, hi, off = keys.lo.tolist(), keys.hi.tolist(), keys.off.tolist()
    rows = []
    for i in range(keys.n_rows):
        extra = keys.idx[off[i]:off[i + 1]].tolist() if off[i + 1] > off[i] else []
        tail = list(range(max(lo[i], hi[i] - width - 1 + len(extra)), hi[i])) + extra[-width - 1:]
        if not tail or tail[-1] != dest[i]:
            raise ValueError(f"row {i}'s keys do not end at its own slot {dest[i]}: a short convolution needs "
                             "each row to see its own sequence's rows in order, itself last")
        rows.append(_last(tail[:-1], width))
    return rows


def _last(slots: list[int], width: int) -> list[int]:
    """The last `width` slots, -1 in front where fewer."""
    tail = slots[-width:] if width else []
    return [-1] * (width - len(tail)) + tail
