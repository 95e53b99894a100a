"""A loaded target (+ optional draft) ready to generate: what the CLI, chat, server and benches use.

`load_runtime` finds the pulled bundles, loads models (memory-mapped) with the chosen linear backend,
builds the KV caches and the engine. The runtime is not thread-safe: one generation at a time (the
server serializes requests through its worker), or one batch of them (`batch`). It never downloads anything: a model that is not
pulled is an error that names the pull command.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from speczoo.cache import KVCache
from speczoo.events import DoneEvent, GenerationRequest, TokenEvent
from speczoo.kernels import native
from speczoo.kernels.backends import DEFAULT_FAST_BACKEND, NO_SIMD_BACKENDS
from speczoo.models.args import ModelArgs
from speczoo.decoding.drafters.eagle import TreeShape
from speczoo.decoding.drafters.ngram import NgramDrafter
from speczoo.eagle_heads import EagleHeads
from speczoo.decoding.drafters.ngram_tree import NgramTreeDrafter
from speczoo.decoding.types import MAX_K
from speczoo.decoding.costprofile import runtime_costs
from speczoo.decoding.engine import Engine
from speczoo.decoding.batch import CHUNK, BatchEngine
from speczoo.decoding.modes import SpecMode
from speczoo.decoding.prompt_checks import check_ids
from speczoo.slots import SlotCache
from speczoo.textgen import TextBatch, generate_text
from speczoo.tokenizer import Tokenizer
from speczoo.zoo.bundle import find_bundle, read_manifest
from speczoo.zoo.weights import load_model    # a lean bundle's fp32/bf16 weights come from its source

# `auto` leaves the tree drafters out: the controller prices a K-node tree as a K-token chain (it cannot
# accept more than the tree's depth), so it picks trees where they cannot pay (docs/results.md).
# `--spec ngram-tree` and `--spec eagle-tree` stay.
AUTO_EXCLUDES = frozenset({"ngram-tree", "eagle-tree"})


@dataclass
class LoadedModel:
    name: str
    path: Path
    args: ModelArgs
    model: nn.Module
    tokenizer: Tokenizer
    backend: str


_NOTED: set[str] = set()      # models whose slower default has been pointed out in this process


def default_backend(bundle: Path) -> str:
    """The fast backend the bundle was packed for at pull time (the kernels' default when it stores that one
    among others, and when it stores none); on a CPU without a SIMD kernel path, the fastest of
    NO_SIMD_BACKENDS whose packing the bundle stores."""
    packed = read_manifest(bundle).packed_backends
    if not packed:
        return DEFAULT_FAST_BACKEND
    if native.chosen_path().simd:
        return DEFAULT_FAST_BACKEND if DEFAULT_FAST_BACKEND in packed else packed[0]
    return next((b for b in NO_SIMD_BACKENDS if b in packed), packed[0])


def _note_slow_default(name: str, backend: str) -> None:
    """Say (once per model) when the CPU has no SIMD kernel path and the bundle lacks the packing of the
    backend that is fastest there."""
    best = NO_SIMD_BACKENDS[0]
    if backend == best or native.chosen_path().simd or name in _NOTED:
        return
    _NOTED.add(name)
    print(f"speczoo: {name} loads with the {backend} backend, and on this CPU's scalar kernels {best} runs "
          f"several times faster; `speczoo pull {name} --backend {best}` stores its packing, which later "
          f"loads then use", file=sys.stderr, flush=True)


def load(name: str, backend: str | None = None) -> LoadedModel:
    """Load one pulled model (zoo name or local path) with `backend` (default: default_backend)."""
    path = find_bundle(name)
    if backend is None:
        backend = default_backend(path)
        _note_slow_default(name, backend)
    args = ModelArgs.from_json(path / "config.json")
    return LoadedModel(name=name, path=path, args=args, model=load_model(path, backend),
                       tokenizer=Tokenizer.from_bundle(path), backend=backend)


class Runtime:
    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, max_seq: int = 4096,
                 remeasure_costs: bool = False, eagle_tree: TreeShape = TreeShape(), eagle_head: str | None = None):
        if max_seq < 2:
            raise ValueError(f"--max-seq must be at least 2, got {max_seq}")
        self.target = target
        self.draft = draft
        self.name = target.name
        self.tokenizer = target.tokenizer
        self.max_seq = max_seq
        self.vocab_size = target.args.vocab_size     # valid token ids: 0 .. vocab_size - 1
        if draft is not None:
            from speczoo.decoding.pair import check_pair
            check_pair(draft, target).raise_if_bad(draft.name, target.name)
        costs = runtime_costs(target, draft, remeasure=remeasure_costs)
        drafters = {"ngram": lambda req: NgramDrafter(max_order=req.ngram),
                    "ngram-tree": lambda req: NgramTreeDrafter(max_order=req.ngram)}
        if draft is not None:
            from speczoo.decoding.drafters.draft_model import make_draft_drafter
            drafters["draft"] = make_draft_drafter(draft, target, max_seq, rows=costs.rows["draft"])
        self.eagle = EagleHeads(target.name, target.model, max_seq, eagle_tree, backend=target.backend,
                                default=eagle_head)
        if self.eagle.default is not None:
            drafters["eagle"] = self.eagle.factory
            drafters["eagle-tree"] = self.eagle.tree_factory
        self.spec_modes = ["off", *drafters, "auto"]
        cache = KVCache(target.args, max_seq, extra=MAX_K + 1)
        self.engine = Engine(target.model, cache, drafters,
                             eos_ids=self.tokenizer.eos_ids, max_seq=max_seq,
                             costs=costs,
                             auto_excludes=AUTO_EXCLUDES)
        if self.eagle.default is not None:
            self._use_eagle("eagle")

    def generate(self, request: GenerationRequest) -> Iterator[TokenEvent | DoneEvent]:
        """Validate the request now (errors raise before any event), then stream its events."""
        self._check_ids(request)
        if SpecMode.parse(request.spec).eagle_head:
            self._use_eagle(request.spec)
        return generate_text(self.engine, self.tokenizer, request)

    def _check_ids(self, request: GenerationRequest) -> None:
        check_ids(request.prompt_ids, self.vocab_size, self.name)

    def batch(self, n_slots: int, chunk: int = CHUNK) -> TextBatch:
        """Up to `n_slots` requests at once in one target forward per step (continuous batching,
        decoding/batch.py), each in a KV slot of `slot_bytes()`, `chunk` prompt rows per step; the same
        TokenEvent / DoneEvent stream per request as `generate`. Shares this runtime's model: use one
        or the other at a time. Modes whose drafter shares one cache across requests (draft, EAGLE) are
        refused in a batch."""
        slots = SlotCache(self.target.args, n_slots, self.max_seq + MAX_K + 1)
        return TextBatch(BatchEngine(self.engine, slots, chunk), self.tokenizer, self._check_ids)

    def cannot_batch(self) -> str | None:
        """Why this runtime cannot `batch` (None: it can)."""
        if self.target.args.sliding_window > 0:
            return f"{self.name} has sliding-window layers (Gemma 3), which a batch's slot cache cannot hold"
        return None

    def slot_bytes(self) -> int:
        """The KV bytes of one batch slot (fp32 keys and values of every layer for max_seq + a verify)."""
        a = self.target.args
        return 2 * a.n_layers * a.n_kv_heads * a.head_dim * 4 * (self.max_seq + MAX_K + 1)

    def _use_eagle(self, spec: str) -> None:
        """Load the EAGLE head `spec` names (errors now, before any event), offer the "eagle" and
        "eagle-tree" drafters and give the controller their measured costs in target decode steps: a
        chain pays one head step per token; a tree one batched step per depth for `branch` nodes, so
        about a step per `branch` nodes."""
        step = self.eagle.step_cost(self.eagle.resolve(spec))     # loads the head: errors before anything
        for name, factory, cost in (("eagle", self.eagle.factory, step),
                                    ("eagle-tree", self.eagle.tree_factory, step / self.eagle.tree.branch)):
            self.engine.offer(name, factory, cost_per_token=cost)
            if name not in self.spec_modes:
                self.spec_modes.insert(-1, name)

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """Render messages through the chat template (generation prompt appended) and encode."""
        return self.tokenizer.chat_ids(messages)


def load_runtime(target: str, draft: str | None = None, backend: str | None = None,
                 max_seq: int = 4096, remeasure_costs: bool = False, eagle_head: str | None = None) -> Runtime:
    """remeasure_costs: time c_v and the draft cost now (benches do, so that the controller sees this
    machine's present speed) instead of reading the profile cached in the bundle. eagle_head: the EAGLE
    head that "eagle", "eagle-tree" and "auto" use (default: the newest installed for the target)."""
    t = load(target, backend)
    d = load(draft, backend) if draft else None
    return Runtime(t, d, max_seq=max_seq, remeasure_costs=remeasure_costs, eagle_head=eagle_head)
