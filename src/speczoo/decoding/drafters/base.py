"""The drafter interface: propose K tokens cheaply; learn which were accepted.

A drafter owns only its own state (an n-gram index, a draft model's KV cache). It never touches the
target's cache and never decides acceptance: the engine calls `propose`, verifies with the pure
functions of `decoding/verify/`, then tells the drafter how many draft tokens survived with `commit` (a
chain) or which nodes did with `commit_path` (a token tree). A drafter that reads the target's own
hidden states (EAGLE) names their layers in `hidden_layers`; the engine then asks the target forward
for them and hands over the committed positions' rows through `observe` (see FeatureTaps).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from torch import Tensor

from speczoo.decoding.types import Draft


class Drafter(ABC):
    name: str = ""
    hidden_layers: tuple[int, ...] = ()   # target layers (residual after layer i) read through `observe`
    stops_on_confidence: bool = False     # honours `floors` in `propose` (knows how sure it is of each token)
    drafts_trees: bool = False            # proposes token trees (Draft.parents): priced by its own trees' acceptance

    @abstractmethod
    def reset(self) -> None:
        """Forget everything: a new sequence starts."""

    def prefill(self, prompt: list[int]) -> None:
        """Ingest the prompt while the target runs its own prefill (a draft model's cache fills here,
        so its first proposal does not pay for the whole prompt). Default: nothing to do."""

    @abstractmethod
    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        """Propose up to k tokens to follow `context`: a chain, or a token tree of at most k nodes
        (Draft.parents set, every parent before its children; see decoding/verify/tree.py).

        context: every committed id so far (prompt + output); its last id is the token the round's
        verify forward starts from (a0). The same growing list is passed every round, so a drafter
        only has to look at the ids it has not seen yet.
        floors: for a drafter that `stops_on_confidence`: after its first i tokens it stops when the
        product of the probabilities it gave them is below floors[i - 1] (no floor past the list's end).
        Others ignore it.
        """

    @abstractmethod
    def commit(self, accepted: int) -> None:
        """The target accepted the first `accepted` tokens of the last draft (0..K)."""

    # Prior acceptance α per situation (see `situation`): where the controller's estimate of a situation
    # starts before this generation has judged any of its drafts.
    situation_priors: dict[str, float] = {}

    def situation(self, context: list[int]) -> str | None:
        """A label for how promising this round's proposal would be, asked before the controller chooses
        (context as for `propose`); the controller keeps a separate acceptance estimate per label. None:
        nothing to propose this round. Default: always the one situation ""."""
        return ""

    def branches(self, context: list[int]) -> bool:
        """Of a drafter that drafts_trees: whether this round's tree would branch, asked before the controller
        chooses (context as for `propose`). Beside chain drafters a tree drafter is offered only where it
        would (decoding/round.py `situations`). Default: always."""
        return True

    def lag(self, context: list[int]) -> int:
        """How many ids of `context` (as for `propose`) this drafter would have to feed before proposing,
        beyond the last one: its catch-up after sitting out rounds. Default: none."""
        return 0

    def commit_path(self, path: list[int]) -> None:
        """The target accepted the nodes `path` (indices into the last draft's tokens, root to leaf) of
        a token-tree draft. Default: as many accepted as the path is long, for drafters whose state
        holds committed tokens only and re-syncs from the next context."""
        self.commit(len(path))

    def finish(self, context: list[int]) -> None:
        """The generation ended (finished, stopped by a stop string, or cancelled) with `context`: every
        committed id, prompt and output. Called once. Default: nothing to keep (the suffix drafter hands
        its answer to the memory of earlier answers)."""

    def observe(self, hidden: list[Tensor]) -> None:
        """The target's hidden states [R, D] at `hidden_layers` (in that order) for the R positions just
        committed, oldest first: the prompt after the prefill, then [a0] + the accepted draft after each
        round, whether this drafter drafted or not. Default: not read."""


class FeatureTaps:
    """The engine's side of `observe`: which target layers a request's drafters read, and the hand-over.

    layers: the union of the drafters' hidden_layers in first-seen order, what the engine passes as the
    target forward's hidden_layers (empty when no drafter reads any: the forward then returns none).
    """

    def __init__(self, drafters: Iterable[Drafter]):
        self.readers = [d for d in drafters if d.hidden_layers]
        layers = list(dict.fromkeys(layer for d in self.readers for layer in d.hidden_layers))
        self.layers = tuple(layers)
        self._picks = [[layers.index(layer) for layer in d.hidden_layers] for d in self.readers]

    def send(self, hidden: list[Tensor], rows: Tensor | slice | None = None) -> None:
        """Hand every reader its layers' states of the committed rows of one forward (`rows`; None: all)."""
        for d, pick in zip(self.readers, self._picks):
            d.observe([hidden[j] if rows is None else hidden[j][rows] for j in pick])
