"""How long an idle OpenMP thread spins before it sleeps: said, and left to the user.

libgomp (torch's OpenMP runtime on Linux, which the compiled kernels share) reads its environment once,
when it is loaded, at `import torch`. Left alone, a thread that waits (at a barrier, or for the next
parallel region) spins for 300,000 pause instructions, milliseconds, before it sleeps. When another
program holds one of the cores, that spinning takes the time slice the awaited thread needs (issue #32).
A bounded spin (GOMP_SPINCOUNT=SPIN_COUNT) keeps more of the speed then, but on a quiet machine every
kernel call must wake sleeping threads, which costs more than the 3% of quiet speed the issue allows
(docs/results.md, "One core busy": the measured trade). So speczoo does not set it; it records what the
runtime will use, `speczoo doctor` shows it, and the README says when to set it.

note() runs first thing when the package is imported (speczoo/__init__.py), before anything imports
torch, so that what it records is what libgomp reads. This module must never import torch, nor anything
that does.
"""

from __future__ import annotations

import os
import sys

SPIN_ENV = "GOMP_SPINCOUNT"
POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_COUNT = 1_000  # the spin the README suggests for a machine where another program keeps a core busy

_state = "not read yet"


def note(environ: dict[str, str] | None = None, runtime_loaded: bool | None = None) -> str:
    """Record which wait policy the OpenMP runtime uses: the user's OMP_WAIT_POLICY / GOMP_SPINCOUNT from
    `environ` (default os.environ), else its default; and whether torch was imported before speczoo
    (default: read sys.modules). Returns and remembers it in words."""
    global _state
    env = os.environ if environ is None else environ
    loaded = "torch" in sys.modules if runtime_loaded is None else runtime_loaded
    chosen = [f"{k}={env[k]}" for k in (POLICY_ENV, SPIN_ENV) if env.get(k, "").strip()]
    if chosen:
        _state = f"yours: {', '.join(chosen)}"
        if loaded:
            _state += " (torch was imported before speczoo: it applies if it was set before that import)"
    else:
        _state = (f"the OpenMP runtime's default (a long spin); with another program busy on a core, "
                  f"{SPIN_ENV}={SPIN_COUNT} keeps more speed and costs some when quiet")
    return _state


def state() -> str:
    """What note() recorded, in words (for `speczoo doctor`)."""
    return _state
