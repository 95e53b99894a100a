"""The drafter interface: propose K tokens cheaply; learn which were accepted.

A drafter owns only its own state (an n-gram index, a draft model's KV cache). It never touches the
target's cache and never decides acceptance: the engine calls `propose`, verifies with the pure
functions in `spec.verify`, then tells the drafter how many draft tokens survived with `commit`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from speczoo.spec.types import Draft


class Drafter(ABC):
    name: str = ""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything: a new sequence starts."""

    def prefill(self, prompt: list[int]) -> None:
        """Ingest the prompt while the target runs its own prefill (a draft model's cache fills here,
        so its first proposal does not pay for the whole prompt). Default: nothing to do."""

    @abstractmethod
    def propose(self, context: list[int], k: int) -> Draft:
        """Propose up to k tokens to follow `context`.

        context: every committed id so far (prompt + output); its last id is the token the round's
        verify forward starts from (a0). The same growing list is passed every round, so a drafter
        only has to look at the ids it has not seen yet.
        """

    @abstractmethod
    def commit(self, accepted: int) -> None:
        """The target accepted the first `accepted` tokens of the last draft (0..K)."""
