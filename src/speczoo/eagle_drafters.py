"""A loaded target's EAGLE head, resolved once at load: the head the "eagle" and "eagle-tree" drafters
(decoding/drafters/registry.py) draft with, and its step's cost in target steps.

The head is the one named when the runtime is loaded (`--spec eagle:NAME` / `eagle-tree:NAME`: an
installed head, or a head directory by path), else the newest head installed for the target, else none
(no EAGLE mode is offered). It loads memory-mapped on the target's embedding, its linear layers packed
for the target's own linear backend (a draft step is bound by weight bytes: docs/eagle.md), and its step
is timed against the target's then. A request never picks another head: a request naming one the
runtime did not load is an error (decoding/engine.py). A head whose shapes do not fit the target is an
error naming both, never a silent skip. This module never touches the target's cache.
It belongs to the runtime's layer: it finds heads in the zoo (zoo/heads.py) and loads decoding's EAGLE
head (decoding/eagle/head.py), so neither of them may import it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from speczoo.cache import KVCache
from speczoo.decoding.drafters.eagle import TreeShape
from speczoo.decoding.eagle.head import EagleHead
from speczoo.decoding.eagle.io import load_head
from speczoo.zoo.heads import HeadEntry, find_head, heads_for


@dataclass(frozen=True)
class LoadedHead:
    """The EAGLE head a runtime drafts with (what the registry's EAGLE descriptors bind to).

    entry: the zoo entry; head: the head, packed for the target's backend; step: its draft step in target
    decode steps (head_step_cost); tree: the shape of "eagle-tree" proposals; names: the NAMEs a request's
    `eagle:NAME` may give it (the one it was loaded by, and its zoo name).
    """

    entry: HeadEntry
    head: EagleHead
    step: float
    tree: TreeShape
    names: tuple[str, ...]


def installed(target_name: str) -> list[HeadEntry]:
    """The heads installed for the target named `target_name`, oldest first (by their weights' mtime)."""
    return sorted(heads_for(target_name), key=lambda h: (h.path / "model.safetensors").stat().st_mtime)


def resolve_head(target_name: str, named: str | None = None) -> HeadEntry | None:
    """The head a runtime of `target_name` drafts with: the one `named` (an installed name or a
    directory; unknown: UnknownModelError), else the newest installed for the target, else None."""
    if named:
        return find_head(named)
    heads = installed(target_name)
    return heads[-1] if heads else None


def load_for(entry: HeadEntry, model, target_name: str, backend: str = "fp32") -> EagleHead:
    """The head of `entry` on the target `model` (its embedding), packed for `backend`; a ValueError
    naming both when its shapes do not fit the target."""
    cfg, args = entry.config, model.args
    if max(cfg.target_layers) >= args.n_layers or cfg.hidden_size != args.dim:
        raise ValueError(f"EAGLE head {entry.name!r} (trained for {cfg.target!r}: width {cfg.hidden_size}, "
                         f"layers {cfg.aux_layer_ids}) does not fit {target_name!r} (width {args.dim}, "
                         f"{args.n_layers} layers)")
    return load_head(entry.path, model.embed).pack(backend)


def load_eagle(target_name: str, model, backend: str = "fp32", named: str | None = None,
               tree: TreeShape = TreeShape()) -> LoadedHead | None:
    """The head a runtime drafts with (resolve_head), loaded and its step timed now (head_step_cost, a
    few tenths of a second); None when none is named or installed. model: the loaded target."""
    entry = resolve_head(target_name, named)
    if entry is None:
        return None
    head = load_for(entry, model, target_name, backend)
    names = tuple(dict.fromkeys(n for n in (named, entry.name) if n))
    return LoadedHead(entry, head, head_step_cost(head, model, model.args), tree, names)


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
    prefill and `rounds` target steps."""
    head_step, target_step = _head_stepper(head, context), _target_stepper(model, args, context)
    head_step(), target_step()                                      # warm both
    h = t = float("inf")
    for _ in range(rounds):
        h = min(h, *(head_step() for _ in range(repeats)))
        t = min(t, target_step())
    return h / t
