"""Every drafter, described once: one frozen `DrafterSpec` per drafter, and BUILTIN, the ones speczoo ships.

A descriptor is the only place that says, of a drafter:
  name          the `--spec` mode (and the request's `speculative` value) that picks it;
  factory       how one request's drafter is built (GenerationRequest -> Drafter);
  cost          its cost per proposed token in target decode steps, what the controller prices it at;
  auto          whether `auto` may choose it (the controller prices a tree drafter's rounds by its own trees'
                accepted tokens per node budget, decoding/tree_acceptance.py, so prompt lookup's tree is
                offered beside its chain, in the rounds where it branches: decoding/round.py `situations`;
                EAGLE's tree is not yet: its head is shared with the chain's and its trees were never
                replayed inside `auto`);
  batchable     whether it can run in a continuous batch (decoding/batch.py): a drafter that reads the
                target's hidden states (EAGLE) cannot, since a batched forward returns none;
  shared_cache  whether its factories share one cache across requests (a draft model's, a head's): a
                batch then lends it to one greedy `auto` sequence at a time (the lease), never by name;
  takes_name    what `MODE:NAME` names for it (DRAFT_MODEL, EAGLE_HEAD), or None: it takes no name.
The engine (decoding/engine.py), the batch, the mode parser (decoding/modes.py), the runtime and the
commands read these fields; none of them keys a drafter's facts by its name.

A drafter that needs nothing loaded (prompt lookup) is complete here. One that drafts with something a
runtime loads (a draft model, an EAGLE head) has no factory or cost yet: its `load` hook builds them from
what the runtime loaded (`Loaded`), and `DrafterSpec.bound` returns the complete descriptor, or None
where the runtime has nothing for it to draft with. Adding a drafter: its class in a file of this
package, and its descriptor in BUILTIN (docs/architecture.md, "Where to add").

Plain values and factories: nothing here loads a model, and this module never imports the runtime
(what it loaded comes in as `Loaded`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from speczoo.request import GenerationRequest
from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter

Factory = Callable[[GenerationRequest], Drafter]

DRAFT_MODEL = "a draft model"      # takes_name: `draft:NAME` names a draft model of the zoo
EAGLE_HEAD = "an EAGLE head"       # takes_name: `eagle:NAME` names an installed EAGLE head (or its directory)


class Loaded(Protocol):
    """What a runtime loaded, as a descriptor's `load` hook reads it (speczoo/runtime.py builds one).

    target, draft: the loaded target and draft model (.model, .args, .name; draft None without one);
    draft_costs:   the draft model's measured costs (decoding/pricing/profile.py DraftModelCosts; None
                   without a draft model);
    eagle:         the EAGLE head resolved at load (speczoo/eagle_drafters.py LoadedHead: .head, .step,
                   .tree, .names), or None;
    max_seq:       the longest sequence a request may reach;
    kv_dtype:      the element type of the KV caches (torch.float16 or torch.float32);
    suffix_memory: the memory of earlier answers the suffix drafter reads and adds to
                   (drafters/suffix_memory.py SuffixMemory), held by the runtime across requests;
    draft_vocab:   the common ids of the reduced LM head the draft model proposes from
                   (drafters/draft_head.py), or None: its full head.
    """

    target: object
    draft: object | None
    draft_costs: object | None
    eagle: object | None
    max_seq: int
    kv_dtype: object
    suffix_memory: object
    draft_vocab: int | None


@dataclass(frozen=True)
class Bound:
    """What a `load` hook returns: the factory, the cost, and the names `MODE:NAME` may give what it drafts
    with (the name it was loaded by, and the zoo's own name for it)."""

    factory: Factory
    cost: float
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter's facts (see the module docstring); `factory` and `cost` are None until bound.

    names: the NAMEs a `MODE:NAME` request may give what this drafter drafts with once bound (a request
           naming another is an error: the runtime loaded one draft model, one head).
    load:  for a drafter that drafts with something a runtime loads: Loaded -> Bound, or None when the
           runtime has nothing for it (no draft model, no head installed).
    """

    name: str
    factory: Factory | None = None
    cost: float | None = None
    auto: bool = True
    batchable: bool = False
    shared_cache: bool = False
    takes_name: str | None = None
    names: tuple[str, ...] = ()
    load: Callable[[Loaded], Bound | None] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name or self.name in ("off", "auto", "none"):
            raise ValueError(f"a drafter's name must be a plain mode name other than off, auto and none; "
                             f"got {self.name!r}")
        if self.cost is not None and not self.cost >= 0:
            raise ValueError(f"drafter {self.name!r}: cost must be >= 0 target steps per token, got {self.cost}")

    @property
    def by_name_in_batch(self) -> bool:
        """Whether a batch serves it when a request names it (it keeps all its state per request)."""
        return self.batchable and not self.shared_cache

    @property
    def leased(self) -> bool:
        """Whether a batch lends it to one greedy `auto` sequence at a time (one cache across requests)."""
        return self.batchable and self.shared_cache and self.auto

    def bound(self, loaded: Loaded) -> DrafterSpec | None:
        """This descriptor complete for a runtime: itself when it needs nothing loaded, else its factory and
        cost from what the runtime loaded, as a new value; None when the runtime has nothing for it."""
        if self.load is None:
            return self
        b = self.load(loaded)
        return None if b is None else dataclasses.replace(self, factory=b.factory, cost=b.cost, names=b.names)

    def with_factory(self, factory: Factory, cost: float | None = None) -> DrafterSpec:
        """The same drafter built by another factory (and priced at `cost`, None: as before), as a new value:
        benches and tests that stand a drafter in."""
        return dataclasses.replace(self, factory=factory, cost=self.cost if cost is None else cost, load=None)


def _draft_model(loaded: Loaded) -> Bound | None:
    """The draft model's drafter (drafters/draft_model.py), sized by its measured row costs."""
    if loaded.draft is None:
        return None
    from speczoo.decoding.drafters.draft_model import make_draft_drafter

    costs = loaded.draft_costs
    factory = make_draft_drafter(loaded.draft, loaded.target, loaded.max_seq, head_vocab=loaded.draft_vocab,
                                 rows=costs.rows, kv_dtype=loaded.kv_dtype)
    return Bound(factory, costs.step, (loaded.draft.name,))


def _eagle(tree: bool) -> Callable[[Loaded], Bound | None]:
    """The EAGLE drafter (drafters/eagle.py) over the head resolved at load: a chain pays one head step
    per token; a tree one batched step per depth for `branch` nodes, so about a step per `branch` nodes."""

    def load(loaded: Loaded) -> Bound | None:
        e = loaded.eagle
        if e is None:
            return None
        from speczoo.decoding.drafters.eagle import make_eagle_drafter

        if tree:
            return Bound(make_eagle_drafter(e.head, loaded.max_seq, e.tree), e.step / e.tree.branch, e.names)
        return Bound(make_eagle_drafter(e.head, loaded.max_seq), e.step, e.names)

    return load


def _suffix(loaded: Loaded) -> Bound:
    """The suffix drafter (drafters/suffix.py) over the runtime's memory: each request reads its tenant's
    answers as they stand when it starts (a Recall), but a seeded sampled one reads none (its samples
    must not depend on what others asked before). Free, like prompt lookup: priced from its measured time."""
    from speczoo.decoding.drafters.suffix import SuffixDrafter

    memory = loaded.suffix_memory

    def factory(req: GenerationRequest) -> Drafter:
        reproducible = not req.sampling.greedy and req.sampling.seed is not None
        recall = None if reproducible else memory.open(req.tenant)
        return SuffixDrafter(recall, len(req.prompt_ids), max_order=req.ngram)

    return Bound(factory, 0.0)


NGRAM = DrafterSpec("ngram", factory=lambda req: NgramDrafter(max_order=req.ngram), cost=0.0, batchable=True)
NGRAM_TREE = DrafterSpec("ngram-tree", factory=lambda req: NgramTreeDrafter(max_order=req.ngram), cost=0.0,
                         batchable=True)
DRAFT = DrafterSpec("draft", batchable=True, shared_cache=True, takes_name=DRAFT_MODEL, load=_draft_model)
SUFFIX = DrafterSpec("suffix", batchable=True, load=_suffix)
EAGLE = DrafterSpec("eagle", shared_cache=True, takes_name=EAGLE_HEAD, load=_eagle(tree=False))
EAGLE_TREE = DrafterSpec("eagle-tree", auto=False, shared_cache=True, takes_name=EAGLE_HEAD, load=_eagle(tree=True))

# The drafters speczoo ships, in the order the API publishes them (and the controller breaks ties by).
BUILTIN: tuple[DrafterSpec, ...] = (NGRAM, NGRAM_TREE, SUFFIX, DRAFT, EAGLE, EAGLE_TREE)
BY_NAME: Mapping[str, DrafterSpec] = MappingProxyType({s.name: s for s in BUILTIN})
