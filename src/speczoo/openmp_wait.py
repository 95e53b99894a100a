"""How long an idle OpenMP thread spins before it sleeps: a bounded spin, set before the runtime starts.

libgomp (torch's OpenMP runtime on Linux, which the compiled kernels share) reads its environment once,
when it is loaded, at `import torch`. Left alone, a thread that waits (at a barrier, or for the next
parallel region) spins for 300,000 pause instructions, milliseconds, before it sleeps. When another
program holds one of the cores, that spinning takes the time slice the awaited thread needs: with a busy
loop on one of two cores, decode fell to 0.30x of its quiet speed (issue #32). A bounded spin
(GOMP_SPINCOUNT=SPIN_COUNT, microseconds) is meant to cover the short waits of a quiet machine, and
sleeps through the long ones of a contended one. Child processes inherit it; environ_of_the_user() gives
a peer (llama.cpp) the environment without it.

apply() runs first thing when the package is imported (speczoo/__init__.py), before anything imports
torch. It never overrides the user: when OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, theirs is used as is.
When torch was imported before speczoo, libgomp has already read its environment, so setting it would
change nothing: apply() then leaves the environment alone, and state() says so (`speczoo doctor` shows it).
This module must never import torch, nor anything that does.
"""

from __future__ import annotations

import os
import sys

SPIN_ENV = "GOMP_SPINCOUNT"
POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_COUNT = 1_000  # spins of a pause instruction each; docs/results.md, "One core busy", has the choice

_SET_BY_US = ", set by speczoo (a bounded spin)"
_state = "not applied yet"


def apply(environ: dict[str, str] | None = None, runtime_loaded: bool | None = None) -> str:
    """Set GOMP_SPINCOUNT=SPIN_COUNT in `environ` (default os.environ) unless the user chose a wait policy
    or the runtime is already loaded (default: torch is imported). Returns and remembers what happened."""
    global _state
    env = os.environ if environ is None else environ
    loaded = "torch" in sys.modules if runtime_loaded is None else runtime_loaded
    chosen = [f"{k}={env[k]}" for k in (POLICY_ENV, SPIN_ENV) if env.get(k, "").strip()]
    if chosen:
        _state = f"yours: {', '.join(chosen)}"
    elif loaded:
        _state = (f"the OpenMP runtime's default (torch was imported before speczoo; set {SPIN_ENV}={SPIN_COUNT} "
                  f"before starting Python, or import speczoo first, for a bounded spin)")
    else:
        env[SPIN_ENV] = str(SPIN_COUNT)
        _state = f"{SPIN_ENV}={SPIN_COUNT}{_SET_BY_US}"
    return _state


def environ_of_the_user() -> dict[str, str]:
    """os.environ as the user left it: without the spin count apply() set (for a peer's subprocess, such as
    llama.cpp, which must run on its own defaults)."""
    env = dict(os.environ)
    if _state.endswith(_SET_BY_US):
        env.pop(SPIN_ENV, None)
    return env


def state() -> str:
    """What apply() did, in words (for `speczoo doctor`)."""
    return _state
