"""The drafter interface: propose K tokens cheaply; learn which were accepted.

A drafter owns only its own state (an n-gram index, a draft model's KV cache). It never touches the
target's cache and never decides acceptance: the engine calls `propose`, verifies with the pure
functions in `spec.verify`, then tells the drafter how many draft tokens survived with `commit` (a
chain) or which nodes did with `commit_path` (a token tree).
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
        """Propose up to k tokens to follow `context`: a chain, or a token tree of at most k nodes
        (Draft.parents set, every parent before its children; see spec/tree.py).

        context: every committed id so far (prompt + output); its last id is the token the round's
        verify forward starts from (a0). The same growing list is passed every round, so a drafter
        only has to look at the ids it has not seen yet.
        """

    @abstractmethod
    def commit(self, accepted: int) -> None:
        """The target accepted the first `accepted` tokens of the last draft (0..K)."""

    def commit_path(self, path: list[int]) -> None:
        """The target accepted the nodes `path` (indices into the last draft's tokens, root to leaf) of
        a token-tree draft. Default: as many accepted as the path is long, for drafters whose state
        holds committed tokens only and re-syncs from the next context."""
        self.commit(len(path))
