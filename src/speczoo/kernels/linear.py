"""Linear-layer backends behind one interface: y[S, N] = x[S, K] @ W[N, K]^T (+ bias).

A backend turns an fp32 weight into its own packed tensors (`pack`, done once: at pull time for
backends whose packing is stored in the bundle, at load time otherwise) and builds a callable module
from them (`build`). Every backend takes and returns fp32 activations, so the model code never
branches on the backend. fp32 is the reference; every other backend has a parity test against it.
The registry that finds a backend by name is kernels/backends.py; this module never imports the
backends built on it (kernels/quantized.py), so the interface sits below them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Fp32Linear(nn.Module):
    """Reference path: plain fp32 F.linear (not batch-invariant; exactness is the fast path's job)."""

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__()
        self.weight = weight          # [N, K] fp32
        self.bias = bias              # [N] fp32 or None

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        return F.linear(x, self.weight, self.bias)


class Bf16Linear(nn.Module):
    """bf16 weights and activations, fp32 out. Half the bytes of fp32; not batch-invariant."""

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__()
        self.weight = weight          # [N, K] bf16
        self.bias = bias

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] fp32 -> [S, N] fp32
        y = F.linear(x.to(torch.bfloat16), self.weight).float()
        return y if self.bias is None else y + self.bias


class LinearBackend:
    """Base: subclasses set `name`, `stored` and implement pack/build."""

    name: str = ""
    stored: bool = False          # True: pack() runs at pull time and its tensors live in the bundle
    # True: pack() is a few vectorized passes, cheap enough to run at every load, so a bundle does not
    # store a packing it can rebuild from a tensor it keeps anyway (a tied LM head, from the embedding).
    # False for a packing that searches (q4), which is made once, at pull time.
    cheap_pack: bool = False
    batch_invariant: bool = False  # True: row i of a forward of S rows is bit-identical to S = 1

    def pack(self, weight: Tensor) -> dict[str, Tensor]:  # weight: [N, K] fp32
        raise NotImplementedError

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        raise NotImplementedError


class Fp32Backend(LinearBackend):
    name = "fp32"

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return {"weight": weight.float()}

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Fp32Linear(packed["weight"], bias)


class Bf16Backend(LinearBackend):
    name = "bf16"

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return {"weight": weight.to(torch.bfloat16).contiguous()}

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Bf16Linear(packed["weight"], bias)
