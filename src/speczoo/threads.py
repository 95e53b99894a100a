"""How many threads the kernels and torch use: one switch, set once, early, by the CLI.

The compiled kernels read torch.get_num_threads() at every call, so torch.set_num_threads is the one
switch for both. The count is, first to last: `--threads N`, then $OMP_NUM_THREADS, then the machine's
physical cores (a second hyper-thread on a core only fights the first for the same SIMD units and
memory bandwidth). The physical cores come from the kernels' CPU reader (kernels/native.py: the unique
(physical id, core id) pairs of /proc/cpuinfo, `sysctl hw.physicalcpu` on macOS, else os.cpu_count()).

This module never guesses around a bad value: a --threads or $OMP_NUM_THREADS that is not a positive
integer is an error that says so, not a silent default.
"""

from __future__ import annotations

import os

OMP_ENV = "OMP_NUM_THREADS"


def physical_cores() -> int:
    """The machine's physical cores (at least 1)."""
    from speczoo.kernels.native import cpu_info

    return max(1, cpu_info().physical_cores)


def env_threads() -> int | None:
    """$OMP_NUM_THREADS as a thread count, None when unset or empty. OpenMP allows a list ("4,2" for
    nested levels); the first level is the one that counts here."""
    raw = os.environ.get(OMP_ENV, "").strip()
    if not raw:
        return None
    first = raw.split(",", 1)[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise ValueError(f"{OMP_ENV}={raw!r} is not a positive number of threads; set it to one (e.g. 4) or unset it")
    return int(first)


def default_threads() -> int:
    """The thread count when --threads is not given: $OMP_NUM_THREADS, else the physical cores."""
    return env_threads() or physical_cores()


def resolve_threads(n: int | None) -> int:
    """The count to use: `n` (--threads) when given, else default_threads()."""
    if n is None:
        return default_threads()
    if n < 1:
        raise ValueError(f"--threads must be at least 1, got {n}")
    return n


def threads_source(n: int | None) -> str:
    """Where resolve_threads(n) takes its count from, in words (for `speczoo doctor`)."""
    if n is not None:
        return "--threads"
    if env_threads() is not None:
        return f"${OMP_ENV}"
    return "the physical cores"


def apply_threads(n: int | None = None) -> int:
    """Set torch's (and so the kernels') thread count to resolve_threads(n); returns it."""
    import torch

    count = resolve_threads(n)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count
