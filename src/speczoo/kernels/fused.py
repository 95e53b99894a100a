"""Several linear layers that read the same input (q/k/v, gate/up), run as few kernel calls as they can.

`FusedLinears(mods)(x)` returns the tuple (mods[0](x), mods[1](x), ...). When the modules are compiled
integer kernels, each run of consecutive modules of one format (kernels/quantized.py: `joinable`) has
its packed weights concatenated once, here, and one call computes the run's outputs: fewer calls, one
activation quantization per run, and wide enough work to split evenly over the threads. A GGUF whose
q and k are Q4_K and whose v is Q6_K (a Q4_K_M file) thus runs as two calls, q|k in q4 and v in q8b,
and the compiled block (kernels/block.py) takes the runs as they are. The outputs are column views of
the runs' outputs, bit-identical to the separate calls. Any other modules (fp32, bf16, the torch twins)
are simply called one after the other. This module must never change what a column computes.
"""

from __future__ import annotations

from torch import Tensor, nn

from speczoo.kernels.quantized import concat_native, is_compiled, joinable


def compiled_runs(mods: list[nn.Module]) -> list[list[nn.Module]] | None:
    """`mods` cut into runs of consecutive joinable modules, in order; None when a module is not compiled."""
    if not mods or not all(is_compiled(m) for m in mods):
        return None
    runs: list[list[nn.Module]] = [[mods[0]]]
    for m in mods[1:]:
        if joinable(runs[-1] + [m]):
            runs[-1].append(m)
        else:
            runs.append([m])
    return runs


class FusedLinears(nn.Module):
    """Linears on one input x [S, K]: forward returns their outputs ([S, N_i] each) as a tuple."""

    def __init__(self, mods: list[nn.Module]):
        super().__init__()
        runs = compiled_runs(list(mods))
        # one compiled module per run, or the separate modules: no weight is stored twice
        self.runs = nn.ModuleList([] if runs is None else [r[0] if len(r) == 1 else concat_native(r) for r in runs])
        self.run_sizes = [] if runs is None else [[m.n for m in r] for r in runs]
        self.parts = nn.ModuleList(mods if runs is None else [])
        self.fused = self.runs[0] if len(self.runs) == 1 and len(mods) > 1 else None

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        if self.runs:                                             # column views of each run's [S, sum N]
            return tuple(t for run, sizes in zip(self.runs, self.run_sizes) for t in run(x).split(sizes, dim=-1))
        return tuple(m(x) for m in self.parts)
