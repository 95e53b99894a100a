"""A loaded target (+ optional draft, EAGLE head) ready to generate: what the CLI, chat, server and benches use.

`load_runtime` finds the pulled bundles, loads models (memory-mapped) with the chosen linear backend,
measures or reads their cost profiles, resolves the EAGLE head, binds every built-in drafter's
descriptor to what it loaded (decoding/drafters/registry.py: a drafter with nothing to draft with is
not offered) and builds the KV caches and the engine, once: no request changes what is offered. The runtime is not thread-safe: one generation at a time (the
server serializes requests through its worker), or one batch of them (`batch`). It never downloads anything: a zoo model that is
not pulled is an error that names the pull command. A local GGUF file or Hugging Face directory named by path (a target or a
--draft) that is not pulled yet is pulled first, with the pull's progress, as `speczoo pull PATH` would: the user named a file
already on disk, and converting it is part of running it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from speczoo.cache import KVCache
from speczoo.context import DEFAULT_KV_TYPE, available_memory, choose_max_seq, kv_bytes_per_token, kv_dtype
from speczoo.errors import NotPulledError
from speczoo.events import DoneEvent, TokenEvent
from speczoo.facts import ModelFacts
from speczoo.request import GenerationRequest
from speczoo.kernels import native
from speczoo.kernels.backends import DEFAULT_FAST_BACKEND, LOAD_TIME_BACKEND, NO_SIMD_BACKENDS, get_backend
from speczoo.kernels.quantized import MixedBackend
from speczoo.models.args import ModelArgs
from speczoo.decoding.batch import BatchEngine
from speczoo.decoding.drafters.draft_model import reduced_head
from speczoo.decoding.drafters.eagle import TreeShape
from speczoo.decoding.drafters.registry import BUILTIN
from speczoo.decoding.drafters.suffix_memory import SuffixMemory
from speczoo.decoding.engine import Engine
from speczoo.decoding.modes import AUTO, OFF
from speczoo.decoding.pricing.profile import DraftModelCosts, runtime_costs
from speczoo.decoding.prompt_checks import check_ids
from speczoo.decoding.tuning import BATCHING, DRAFTING
from speczoo.decoding.types import MAX_K
from speczoo.eagle_drafters import LoadedHead, load_eagle
from speczoo.grammar import Grammars
from speczoo.heap import release_free_heap
from speczoo.slots import SlotCache
from speczoo.textgen import TextBatch, generate_text
from speczoo.threads import steer
from speczoo.tokenizer import Tokenizer
from speczoo.zoo.bundle import find_bundle, read_manifest
from speczoo.zoo.policy import PackRow, stale_rows
from speczoo.zoo.registry import MODELS, resolve
from speczoo.zoo.weights import load_model    # a lean bundle's fp32/bf16 weights come from its source


@dataclass
class LoadedModel:
    name: str
    path: Path
    args: ModelArgs
    model: nn.Module
    tokenizer: Tokenizer
    backend: str
    bundle_id: str = ""     # the bundle's identity (source digest and pull time): its cost profile's key


@dataclass(frozen=True)
class _Loaded:
    """What a runtime loaded, as the drafters' descriptors bind to it (decoding/drafters/registry.py Loaded)."""

    target: LoadedModel
    draft: LoadedModel | None
    draft_costs: DraftModelCosts | None
    eagle: LoadedHead | None
    max_seq: int
    kv_dtype: torch.dtype
    suffix_memory: SuffixMemory
    draft_vocab: int | None


_NOTED: set[str] = set()      # models whose slower default has been pointed out in this process


def default_backend(bundle: Path) -> str:
    """The fast backend the bundle was packed for at pull time (the kernels' default when it stores that one
    among others); on a CPU without a SIMD kernel path, the fastest of NO_SIMD_BACKENDS whose packing the
    bundle stores. A bundle that stores no packing (pulled with a backend that packs at load, `--backend
    fp32` or `bf16`) loads with LOAD_TIME_BACKEND, which needs none: any stored backend would find its
    packing missing."""
    packed = read_manifest(bundle).packed_backends
    if not packed:
        return LOAD_TIME_BACKEND
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


def _note_stale_packing(name: str, path: Path, backend: str) -> None:
    """Say (once per model) when the bundle's `mixed` packing was made by an earlier policy table (a Q4_1
    tensor in q8b, re-rounded, where q8bm now holds it exactly): it loads and runs as it did, and a plain
    `speczoo pull NAME` re-packs it by the current table."""
    if f"stale:{name}" in _NOTED or not isinstance(get_backend(backend), MixedBackend):
        return
    stale = stale_rows([PackRow.from_json(r) for r in read_manifest(path).packing.get(backend, [])])
    if stale:
        _NOTED.add(f"stale:{name}")
        print(f"speczoo: {name}'s {backend} packing was made by an earlier speczoo (" + ", ".join(
              f"{r.source_type} in {r.format}, held in {r.wanted} now" for r in stale) + f"); `speczoo pull "
              f"{name}` re-packs it by the current table", file=sys.stderr, flush=True)


def bundle_of(name: str, backend: str | None = None) -> Path:
    """The bundle of a zoo name, bundle directory or local path; a local GGUF file or HF directory not
    pulled yet is pulled now (packing `backend`), its progress on stderr. NotPulledError for a zoo model
    that is not pulled: downloading it is the user's call (`speczoo pull NAME`)."""
    try:
        return find_bundle(name)
    except NotPulledError:
        if resolve(name).kind == "zoo":
            raise
    from speczoo.zoo.pull import pull

    print(f"speczoo: {name} is not pulled yet; pulling it now, as `speczoo pull {name}` does", file=sys.stderr,
          flush=True)
    return pull(name, backend=backend).bundle


def load(name: str, backend: str | None = None) -> LoadedModel:
    """Load one model (zoo name, bundle directory or local path: `bundle_of`) with `backend` (default:
    default_backend)."""
    path = bundle_of(name, backend)
    if backend is None:
        backend = default_backend(path)
        _note_slow_default(name, backend)
    _note_stale_packing(name, path, backend)
    args = ModelArgs.from_json(path / "config.json")
    manifest = read_manifest(path)
    loaded = LoadedModel(name=name, path=path, args=args, model=load_model(path, backend),
                         tokenizer=Tokenizer.from_bundle(path), backend=backend,
                         bundle_id=f"{manifest.source.sha256} {manifest.created}")
    release_free_heap()          # what the tokenizer's parse freed would stay resident (~50 MB for 150k words)
    return loaded


class Runtime:
    """A loaded target ready to generate, with every drafter it can offer bound once, here.

    target, draft: loaded models (`load`; draft None: no draft model, so no "draft" mode); max_seq: the
    longest prompt + output (None: the target's own context length, capped by the memory available:
    speczoo/context.py; `context_note` says which); kv_type: the KV caches' element type, "f16" or "f32";
    remeasure_costs: time the cost profiles now instead of reading the stored
    ones; eagle_tree: the shape of "eagle-tree" proposals; eagle_head: the EAGLE head to draft with (a
    name or directory; None: the newest installed for the target, if any); suffix_memory: the earlier answers
    the suffix drafter reads, kept here across requests (default: a SuffixMemory of the default cap, one
    per API key); draft_vocab: the draft model proposes from a reduced LM head over its first draft_vocab
    ids plus the prompt's own (decoding/drafters/draft_head.py; None: its full head). The draft's cost
    profile is stored per draft_vocab: another size is timed once (the draft only) and read after.
    The engine steers the thread count while it generates (speczoo/threads.py's `steer()`: None where
    --threads, $OMP_NUM_THREADS or SPECZOO_ADAPTIVE_THREADS=0 fix it).
    """

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, max_seq: int | None = None,
                 remeasure_costs: bool = False, eagle_tree: TreeShape = TreeShape(), eagle_head: str | None = None,
                 suffix_memory: SuffixMemory | None = None, draft_vocab: int | None = DRAFTING.head_vocab,
                 kv_type: str = DEFAULT_KV_TYPE):
        self.kv_dtype = kv_dtype(kv_type)
        per_token = sum(kv_bytes_per_token(m.args, self.kv_dtype) for m in (target, draft) if m is not None)
        choice = choose_max_seq(max_seq, target.args.context_length, per_token,
                                available_memory() if max_seq is None else 0, kv_type)
        max_seq = choice.max_seq
        self.context_note = choice.reason
        self.target = target
        self.draft = draft
        self.name = target.name
        self.tokenizer = target.tokenizer
        self.max_seq = max_seq
        self.vocab_size = target.args.vocab_size     # valid token ids: 0 .. vocab_size - 1
        if draft is not None:
            from speczoo.decoding.pair import check_pair
            check_pair(draft, target).raise_if_bad(draft.name, target.name)
        # the draft is priced through the head it proposes from (its profile is keyed by that head's size)
        costs, draft_costs = runtime_costs(target, draft, remeasure=remeasure_costs, draft_head=reduced_head,
                                           draft_vocab=draft_vocab)
        # the EAGLE head is resolved, loaded and priced now (errors before any request), never per request
        eagle = load_eagle(target.name, target.model, target.backend, named=eagle_head, tree=eagle_tree)
        self.suffix_memory = SuffixMemory() if suffix_memory is None else suffix_memory
        loaded = _Loaded(target, draft, draft_costs, eagle, max_seq, self.kv_dtype, self.suffix_memory,
                         draft_vocab)
        drafters = [b for spec in BUILTIN if (b := spec.bound(loaded)) is not None]
        cache = KVCache(target.args, max_seq, extra=MAX_K + 1, dtype=self.kv_dtype)
        self.engine = Engine(target.model, cache, drafters, eos_ids=self.tokenizer.eos_ids, max_seq=max_seq,
                             costs=costs, grammars=Grammars(self.tokenizer, self.vocab_size), steer=steer())
        self.eagle = eagle

    @property
    def spec_modes(self) -> list[str]:
        """The modes this runtime offers: off, each drafter it loaded, auto."""
        return [OFF, *self.engine.drafters, AUTO]

    def generate(self, request: GenerationRequest) -> Iterator[TokenEvent | DoneEvent]:
        """Validate the request now (errors raise before any event), then stream its events."""
        self._check_ids(request)
        return generate_text(self.engine, self.tokenizer, request)

    def _check_ids(self, request: GenerationRequest) -> None:
        check_ids(request.prompt_ids, self.vocab_size, self.name)

    def batch(self, n_slots: int, chunk: int = BATCHING.chunk) -> TextBatch:
        """Up to `n_slots` requests at once in one target forward per step (continuous batching,
        decoding/batch.py), each in a KV slot of `slot_bytes()`, `chunk` prompt rows per step; the same
        TokenEvent / DoneEvent stream per request as `generate`. Shares this runtime's model: use one
        or the other at a time. Each drafter runs as its descriptor says (decoding/batch.py): prompt
        lookup by name, the draft model lent to one greedy `auto` request at a time, EAGLE not at all."""
        slots = SlotCache(self.target.args, n_slots, self.max_seq + MAX_K + 1, dtype=self.kv_dtype)
        return TextBatch(BatchEngine(self.engine, slots, chunk), self.tokenizer, self._check_ids)

    def cannot_batch(self) -> str | None:
        """Why this runtime cannot `batch` (None: it can)."""
        if self.target.args.sliding_window > 0:
            return (f"{self.name} has sliding-window layers ({self.target.args.arch}), which a batch's slot cache "
                    "cannot hold")
        return None

    def slot_bytes(self) -> int:
        """The KV bytes of one batch slot (keys and values of every layer for max_seq + a verify)."""
        return kv_bytes_per_token(self.target.args, self.kv_dtype) * (self.max_seq + MAX_K + 1)

    def facts(self) -> ModelFacts:
        """The served model as a catalogue shows it (from its bundle's manifest)."""
        m = read_manifest(self.target.path)
        zoo = MODELS.get(m.name)
        main = max((t for t in m.quantization if t not in ("F32", "F16", "BF16")), default="F32",
                   key=lambda t: m.quantization[t])
        return ModelFacts(arch=m.architecture, quantization=zoo.quantization if zoo else main,
                          size=m.source.size, digest=f"sha256:{m.source.sha256}", modified=m.created,
                          context=self.max_seq, chat_template=self.tokenizer.chat_template or "")

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """Render messages through the chat template (generation prompt appended) and encode."""
        return self.tokenizer.chat_ids(messages)


def load_runtime(target: str, draft: str | None = None, backend: str | None = None,
                 max_seq: int | None = None, remeasure_costs: bool = False, eagle_head: str | None = None,
                 suffix_memory: SuffixMemory | None = None, draft_vocab: int | None = DRAFTING.head_vocab,
                 kv_type: str = DEFAULT_KV_TYPE) -> Runtime:
    """remeasure_costs: time c_v and the draft cost now (benches do, so that the controller sees this
    machine's present speed) instead of reading the profile cached in the bundle. eagle_head: the EAGLE
    head that "eagle", "eagle-tree" and "auto" use (default: the newest installed for the target).
    suffix_memory: the suffix drafter's memory of earlier answers (default: the default cap, per API key).
    draft_vocab: the reduced draft head's common ids (see Runtime; None: the full head).
    max_seq, kv_type: as Runtime takes them; the line that says which cap set the context goes to stderr."""
    kv_dtype(kv_type)                                   # a bad --kv-type fails before anything loads
    t = load(target, backend)
    d = load(draft, backend) if draft else None
    rt = Runtime(t, d, max_seq=max_seq, remeasure_costs=remeasure_costs, eagle_head=eagle_head,
                 suffix_memory=suffix_memory, draft_vocab=draft_vocab, kv_type=kv_type)
    print(f"speczoo: {rt.context_note}", file=sys.stderr)
    return rt
