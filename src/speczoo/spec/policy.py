"""Per-round choice of drafter and K for the engine: a thin adapter over spec.controller.

The engine asks `choose()` before each round and reports `update(drafter, drafted, accepted)` after
it. This module only maps a request's spec mode onto a controller configuration; the decisions
themselves live in spec/controller.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from speczoo.events import GenerationRequest


@dataclass
class Choice:
    drafter: str      # "" or "none": plain decoding this round
    k: int


class Policy(Protocol):
    def choose(self) -> Choice | None: ...
    def update(self, drafter: str, drafted: int, accepted: int) -> None: ...


class FixedPolicy:
    """Always the same drafter and K (no gate); with no drafter, plain decoding."""

    def __init__(self, drafter: str, k: int):
        self.choice = Choice(drafter, k) if drafter else None

    def choose(self) -> Choice | None:
        return self.choice

    def update(self, drafter: str, drafted: int, accepted: int) -> None:
        pass


def make_policy(req: GenerationRequest, drafters: list[str]) -> Policy:
    if not drafters:
        return FixedPolicy("", 0)
    return FixedPolicy(drafters[0], req.k)
