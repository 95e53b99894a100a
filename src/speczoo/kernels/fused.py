"""Several linear layers that read the same input (q/k/v, gate/up), run as one kernel call when they can.

`FusedLinears(mods)(x)` returns the tuple (mods[0](x), mods[1](x), ...). When the modules are compiled
integer kernels of one format (kernels/quantized.py: `concat_native`), their packed weights are
concatenated once, here, and one call computes every output: fewer calls, one activation quantization,
and wide enough work to split evenly over the threads. The outputs are then column views of one
[S, sum N] tensor, bit-identical to the separate calls. Any other modules (fp32, bf16, the torch twins)
are simply called one after the other. This module must never change what a column computes.
"""

from __future__ import annotations

from torch import Tensor, nn

from speczoo.kernels.quantized import concat_native


class FusedLinears(nn.Module):
    """Linears on one input x [S, K]: forward returns their outputs ([S, N_i] each) as a tuple."""

    def __init__(self, mods: list[nn.Module]):
        super().__init__()
        self.fused = concat_native(list(mods))
        # the separate modules are kept only when there is no fused one (no weight is stored twice)
        self.parts = nn.ModuleList() if self.fused is not None else nn.ModuleList(mods)
        self.sizes = [m.n for m in mods] if self.fused is not None else []

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        if self.fused is not None:
            return self.fused(x).split(self.sizes, dim=-1)       # views of one [S, sum N]
        return tuple(m(x) for m in self.parts)
