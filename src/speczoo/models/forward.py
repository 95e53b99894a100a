"""What one model forward is asked: how its new rows attend (`Attend`) and what it reads out (`Readout`).

A forward takes S new rows (tokens, positions [S]) and a KV cache holding L0 committed rows. The rows
attend in exactly one of three ways, each a frozen value that checks itself when it is built, so that no
wrong combination can be written:
  * `Chain()` (the default): row i sees the prefix [0, L0) and the new rows 0..i;
  * `Tree(mask)`: row i sees the prefix and the new rows mask[i] marks (a token tree's verify);
  * `Packed(keys, dest)`: row i sees exactly the cache slots keys.slots(i), and its K/V go to slot dest[i]
    (independent sequences in one cache: speczoo/slots.py).
Chain and Tree write K/V at slots [L0, L0 + S) and advance the cache's length by S; Packed leaves the
length alone (each sequence's length is its caller's). `Readout` says which rows' logits to compute,
through which head, and which layers' hidden states to return; its parts are independent.

This module holds plain values only: it never runs a model or touches a cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor

from speczoo.kernels.attention import KeyRows


@dataclass(frozen=True)
class Chain:
    """Causal rows: row i sees the cache prefix [0, L0) and the new rows 0..i."""


@dataclass(frozen=True, eq=False)
class Tree:
    """A token tree's rows: row i sees the cache prefix [0, L0) and the new rows j with mask[i, j]."""

    mask: Tensor    # [S, S] bool; True where row i sees row j: its ancestors and itself

    def __post_init__(self) -> None:
        m = self.mask
        if m.dim() != 2 or m.shape[0] != m.shape[1] or m.dtype != torch.bool:
            raise ValueError(f"a Tree's mask must be a square [S, S] bool tensor; got {tuple(m.shape)} {m.dtype}")
        if not bool(m.diagonal().all()):
            raise ValueError("a Tree's mask must let every row see itself (its diagonal must be True)")


@dataclass(frozen=True, eq=False)
class Packed:
    """Rows of independent sequences in one cache: row i sees exactly keys.slots(i), in order, and its
    K/V go to cache slot dest[i]; the cache's length is left alone."""

    keys: KeyRows   # S rows of key slots
    dest: Tensor    # [S] int64 cache slots, one per row

    def __post_init__(self) -> None:
        s = self.keys.n_rows
        if self.dest.shape != (s,) or self.dest.dtype != torch.int64:
            raise ValueError(f"Packed dest must be an int64 [S={s}] tensor of cache slots, one per row of keys; got "
                             f"{tuple(self.dest.shape)} {self.dest.dtype}")
        if s and int(self.dest.min()) < 0:
            raise ValueError(f"Packed dest slots must be >= 0; got {int(self.dest.min())}")


Attend = Union[Chain, Tree, Packed]     # how a forward's new rows attend, and where their K/V go
CHAIN = Chain()


@dataclass(frozen=True, eq=False)
class Readout:
    """What a forward returns besides writing the cache.

    logit_rows:    the R rows whose logits are computed (a slice, or int64 [R] row indices), e.g.
                   slice(-1, None) after a prefill; None: every row (R = S).
    hidden_layers: layer indices (negative counts from the last) whose residual stream [S, D] after that
                   layer is returned, in this order; () for none.
    head:          a stand-in for the LM head over the final-normed rows, [R, D] -> [R, V] (a drafter's
                   reduced vocabulary); None: the model's own.
    """

    logit_rows: Tensor | slice | None = None
    hidden_layers: tuple[int, ...] = ()
    head: Callable[[Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        rows = self.logit_rows
        if rows is not None and not isinstance(rows, slice) and not (
                isinstance(rows, Tensor) and rows.dim() == 1 and rows.dtype == torch.int64):
            raise ValueError(f"Readout logit_rows must be a slice or an int64 [R] tensor of row indices; got {rows!r}")
        layers = self.hidden_layers
        if not isinstance(layers, Sequence) or not all(isinstance(i, int) for i in layers):
            raise ValueError(f"Readout hidden_layers must be a sequence of layer indices (ints); got {layers!r}")
        object.__setattr__(self, "hidden_layers", tuple(layers))


EVERY_ROW = Readout()
LAST_ROW = Readout(logit_rows=slice(-1, None))     # the last row's logits only: after a prefill
