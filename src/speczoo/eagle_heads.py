"""The EAGLE heads of one loaded target, as the engine's "eagle" (chains) and "eagle-tree" (EAGLE-2
dynamic trees) drafter factories.

`--spec eagle:NAME` / `eagle-tree:NAME` names an installed head (or a head directory by path);
`eagle`, `eagle-tree` and `auto` use the head named when the runtime was loaded, else the newest head
installed for the target. Heads load on first use (memory-mapped safetensors on
the target's embedding), their linear layers packed for the target's own linear backend (a draft step
is bound by weight bytes: q4 makes a 1.5B target's head step ~20x cheaper than fp32), and stay loaded;
each keeps one head KV cache reused across requests. A
head whose shapes do not fit the target is an error naming both, never a silent skip. This module
never touches the target's cache.
It belongs to the runtime's layer: it finds heads in the zoo and builds decoding's EAGLE drafter, so
neither of them may import it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from speczoo.cache import KVCache
from speczoo.events import GenerationRequest
from speczoo.decoding.drafters.eagle import EagleDrafter, TreeShape, make_eagle_drafter
from speczoo.decoding.eagle.head import EagleHead
from speczoo.decoding.eagle.io import load_head
from speczoo.decoding.modes import SpecMode
from speczoo.zoo.heads import HeadEntry, find_head, heads_for


class EagleHeads:
    def __init__(self, target_name: str, model, max_seq: int, tree: TreeShape = TreeShape(),
                 backend: str = "fp32", default: str | None = None):
        self.target_name = target_name
        self.model = model                      # the target (its embedding and layer count)
        self.backend = backend                  # linear backend the heads run with
        self.max_seq = max_seq
        self.tree = tree                        # the shape of "eagle-tree" proposals
        self.installed = sorted(heads_for(target_name), key=lambda h: (h.path / "model.safetensors").stat().st_mtime)
        self._default = find_head(default) if default else None      # a head named at load (--spec eagle:NAME)
        self._loaded: dict[str, EagleHead] = {}
        self._step_costs: dict[str, float] = {}   # head name -> its draft step in target steps (head_step_cost)
        self._factories: dict[tuple[str, bool], Callable[[GenerationRequest], EagleDrafter]] = {}

    @property
    def default(self) -> HeadEntry | None:
        """The head named at load, else the newest installed for the target (None: none is)."""
        if self._default is not None:
            return self._default
        return self.installed[-1] if self.installed else None

    def resolve(self, spec: str) -> HeadEntry:
        """The head a spec mode means: "eagle:NAME" / "eagle-tree:NAME" that one, else the default."""
        named = SpecMode.parse(spec).eagle_head
        if named:
            return find_head(named)
        if self.default is None:
            raise ValueError(f"no EAGLE head is installed for {self.target_name!r}: train one with "
                             f"`speczoo train-eagle {self.target_name} --out DIR`, or name one with --spec eagle:NAME")
        return self.default

    def head(self, entry: HeadEntry) -> EagleHead:
        if entry.name not in self._loaded:
            cfg, args = entry.config, self.model.args
            if max(cfg.target_layers) >= args.n_layers or cfg.hidden_size != args.dim:
                raise ValueError(f"EAGLE head {entry.name!r} (trained for {cfg.target!r}: width {cfg.hidden_size}, "
                                 f"layers {cfg.aux_layer_ids}) does not fit {self.target_name!r} (width {args.dim}, "
                                 f"{args.n_layers} layers)")
            self._loaded[entry.name] = load_head(entry.path, self.model.embed).pack(self.backend)
        return self._loaded[entry.name]

    def step_cost(self, entry: HeadEntry) -> float:
        """The head's draft step in target decode steps, timed against the target the first time it is
        asked for (head_step_cost), then remembered."""
        if entry.name not in self._step_costs:
            self._step_costs[entry.name] = head_step_cost(self.head(entry), self.model, self.model.args)
        return self._step_costs[entry.name]

    def _drafter(self, req: GenerationRequest, tree: bool) -> EagleDrafter:
        entry = self.resolve(req.spec)
        key = (entry.name, tree)
        if key not in self._factories:
            self._factories[key] = make_eagle_drafter(self.head(entry), self.max_seq, self.tree if tree else None)
        return self._factories[key](req)

    def factory(self, req: GenerationRequest) -> EagleDrafter:
        """The "eagle" drafter (chains) for one request."""
        return self._drafter(req, tree=False)

    def tree_factory(self, req: GenerationRequest) -> EagleDrafter:
        """The "eagle-tree" drafter (EAGLE-2 dynamic trees of `tree`'s shape) for one request."""
        return self._drafter(req, tree=True)


def _head_stepper(head: EagleHead, context: int) -> Callable[[], float]:
    """A function that times one draft step of the head (one row after `context` cached rows), in ms."""
    g = torch.Generator().manual_seed(0)
    cache = KVCache(head.kv_args(), context + 2)
    feats = torch.randn(context, 3 * head.cfg.hidden_size, generator=g)
    tokens = torch.randint(0, head.cfg.target_vocab, (context + 1,), generator=g)
    head.step(tokens[:context], head.fuse(feats), torch.arange(1, context + 1), cache)
    hidden = torch.randn(1, head.cfg.hidden_size, generator=g)

    def step() -> float:
        t0 = time.perf_counter()
        head.step(tokens[context:], hidden, torch.tensor([context + 1]), cache)
        ms = (time.perf_counter() - t0) * 1000
        cache.truncate(context)
        return ms
    return step


def _target_stepper(model, args, context: int) -> Callable[[], float]:
    """A function that times one decode step of the target (one token after `context` cached ones), in ms."""
    g = torch.Generator().manual_seed(0)
    cache = KVCache(args, context + 2)
    tokens = torch.randint(0, args.vocab_size, (context + 1,), generator=g)
    model(tokens[:context], torch.arange(context), cache, logit_rows=slice(-1, None))

    def step() -> float:
        t0 = time.perf_counter()
        model(tokens[context:], torch.tensor([context]), cache, logit_rows=slice(-1, None))
        ms = (time.perf_counter() - t0) * 1000
        cache.truncate(context)
        return ms
    return step


def head_step_ms(head: EagleHead, context: int = 64, repeats: int = 9) -> float:
    """Median wall time (ms) of one draft step of the head (one row after `context` cached rows)."""
    step = _head_stepper(head, context)
    times = [step() for _ in range(repeats + 2)]
    return statistics.median(times[2:])


def head_step_cost(head: EagleHead, model, args, context: int = 16, rounds: int = 5, repeats: int = 5) -> float:
    """The head's draft step in target decode steps, both timed now, in turn (`rounds` times: `repeats`
    head steps, then one target step), each the fastest seen. A ratio of two timings taken minutes
    apart (a stored profile's step) reads the machine's load as the head's cost, and a head priced too
    dear is never drafted with, so online calibration never corrects it (docs/eagle.md). Costs one small
    prefill and `rounds` target steps (a few tenths of a second for a 1.5B)."""
    head_step, target_step = _head_stepper(head, context), _target_stepper(model, args, context)
    head_step(), target_step()                                      # warm both
    h = t = float("inf")
    for _ in range(rounds):
        h = min(h, *(head_step() for _ in range(repeats)))
        t = min(t, target_step())
    return h / t
