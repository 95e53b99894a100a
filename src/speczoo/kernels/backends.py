"""The linear backends by name: the one registry that model loading, pulling and the runtime ask.

It lists the reference backends (kernels/linear.py) and the integer ones built on the same interface
(kernels/quantized.py); tests register backends of their own through `register`. It must never pick a
backend silently: an unknown name is an error that lists the known ones.
"""

from __future__ import annotations

from speczoo.kernels.linear import Bf16Backend, Fp32Backend, LinearBackend
from speczoo.kernels.quantized import (FloatBackend, MixedBackend, Q4Backend, Q4MixBackend, Q4TorchBackend, Q6Backend,
                                      Q6TorchBackend, Q8Backend, Q8bBackend, Q8bmBackend, Q8bTorchBackend,
                                      Q8TorchBackend, Q40Backend, Q50Backend, Q80Backend)

# Each weight in the compiled kernel format its source type maps to (zoo/policy.py: q4 for Q4_K, q8 for the
# rest), batch-invariant, one path per ISA (kernels/quantized.py).
DEFAULT_FAST_BACKEND = "mixed"
# What a bundle that stores no packing loads with by default (one pulled with `--backend fp32` or `bf16`):
# a backend that packs at load, the exact reference one.
LOAD_TIME_BACKEND = "fp32"
# The batch-invariant backends, fastest first, where the compiled kernels have no SIMD path for the CPU
# (native.chosen_path().simd is False): there the 4-bit unpacking costs more than the bytes it saves, and
# torch's int8 matmul beats the scalar q4 kernel. Measured: docs/results.md, "Kernel paths".
NO_SIMD_BACKENDS = ("q8", "q8_torch", "mixed", "q4mix", "q4", "q4_torch")

BACKENDS: dict[str, LinearBackend] = {b.name: b for b in (
    Fp32Backend(), Bf16Backend(), Q8Backend(), Q4Backend(), Q8TorchBackend(), Q4TorchBackend(), MixedBackend(),
    Q4MixBackend(), Q8bBackend(), Q8bTorchBackend(), Q8bmBackend(), Q8bmBackend(twin=True), Q40Backend(),
    Q40Backend(twin=True), Q50Backend(), Q50Backend(twin=True), Q80Backend(), Q80Backend(twin=True), Q6Backend(),
    Q6TorchBackend(), FloatBackend("f32"), FloatBackend("f16"), FloatBackend("bf16", name="bf16w"))}


def register(backend: LinearBackend) -> None:
    BACKENDS[backend.name] = backend


def get_backend(name: str) -> LinearBackend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown linear backend {name!r}; choose one of {sorted(BACKENDS)}") from None
