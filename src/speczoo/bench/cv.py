"""Measure c_v(S): the cost of one target forward over S tokens relative to S = 1.

Speculation pays only when a verify forward over K+1 tokens costs about one decode step, so this
curve (with the draft cost) is what the cost model and the controller need. Each S is timed after a
prompt of `context` tokens already in the cache, rolled back after every forward, with warm-up and
the median of `repeats` runs, the S values interleaved so that machine noise spreads evenly.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from speczoo.cache import KVCache


@dataclass
class CvResult:
    ms: dict[int, float]        # S -> median milliseconds per forward

    @property
    def cv(self) -> dict[int, float]:
        return {s: t / self.ms[1] for s, t in self.ms.items()}

    def to_json(self, model: str, backend: str) -> dict:
        return {"model": model, "backend": backend, "ms": {str(s): round(t, 3) for s, t in self.ms.items()},
                "cv": {str(s): round(c, 4) for s, c in self.cv.items()}}


def measure_cv(model, args, sizes: list[int], context: int = 64, repeats: int = 7, warmup: int = 2,
               seed: int = 0, head=None) -> CvResult:
    """head: an LM-head stand-in for the forward (a draft's reduced head, see spec/drafters/draft_head.py)."""
    if 1 not in sizes:
        sizes = [1, *sizes]
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(args, context + max(sizes) + 1)
    prompt = torch.randint(0, args.vocab_size, (context,), generator=g)
    with torch.inference_mode():
        model(prompt, torch.arange(context), cache)
        times: dict[int, list[float]] = {s: [] for s in sizes}
        for rep in range(warmup + repeats):
            for s in sizes:
                toks = torch.randint(0, args.vocab_size, (s,), generator=g)
                pos = torch.arange(context, context + s)
                t0 = time.perf_counter()
                model(toks, pos, cache, head=head)
                dt = time.perf_counter() - t0
                cache.truncate(context)
                if rep >= warmup:
                    times[s].append(dt * 1000)
    return CvResult({s: statistics.median(v) for s, v in times.items()})


PROFILE_SIZES = [1, 2, 3, 5, 9, 17]


def profile_path(loaded) -> Path:
    return loaded.path / f"cost-{loaded.backend}.json"


def load_or_measure(loaded, remeasure: bool = False) -> dict:
    """The model's cost profile {"ms": {S: ms}, "cv": {S: c_v}} on its backend, cached in the bundle,
    plus "draft_ms": its decode step when drafting with the reduced-vocabulary head (when it has one).

    Measured once (a few seconds) the first time a runtime needs it, then read back; `speczoo cv MODEL
    --save` re-measures and stores it (do that on a quiet machine: a busy one inflates every figure).
    remeasure=True (benches: the controller should see the machine as it is now) measures afresh for
    this process only and leaves a stored profile alone, so one run on a loaded machine cannot skew
    every later run's controller.
    """
    import json

    path = profile_path(loaded)
    if path.is_file() and not remeasure:
        return json.loads(path.read_text())
    res = measure_cv(loaded.model, loaded.args, PROFILE_SIZES, context=64, repeats=3, warmup=1)
    data = profile_data(loaded, res)
    if not path.is_file():
        write_profile(loaded, data)
    return data


DRAFT_SIZES = [1, 2, 3, 5, 9]     # rows of a draft forward: a step with up to 8 prompt-lookup guesses


def profile_data(loaded, res: CvResult, repeats: int = 3) -> dict:
    """The profile to store: the c_v table, plus, when the model has a reduced draft head, its draft
    step ("draft_ms") and that forward's cost over S rows ("draft_cv", which sizes its guesses)."""
    data = res.to_json(loaded.name, loaded.backend)
    head = draft_head(loaded)
    if head is not None:
        d = measure_cv(loaded.model, loaded.args, DRAFT_SIZES, context=64, repeats=repeats, warmup=1, head=head)
        data["draft_ms"] = round(d.ms[1], 3)
        data["draft_cv"] = {str(s): round(c, 4) for s, c in d.cv.items()}
    return data


def write_profile(loaded, data: dict) -> None:
    import json

    path = profile_path(loaded)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def draft_head(loaded):
    """The reduced head the model drafts with (spec/drafters/draft_model.py), or None."""
    from speczoo.spec.drafters.draft_head import ReducedHead
    from speczoo.spec.drafters.draft_model import DRAFT_HEAD_VOCAB

    return ReducedHead.for_model(loaded.model, DRAFT_HEAD_VOCAB)


def runtime_costs(target, draft=None, round_overhead: float = 0.02, remeasure: bool = False):
    """Costs for the controller: the target's measured c_v curve and the draft's relative step cost."""
    from speczoo.spec.controller import Costs
    from speczoo.spec.cost import CvCurve

    t = load_or_measure(target, remeasure)
    draft_cost = {"ngram": 0.0, "ngram-tree": 0.0}
    rows = {}
    if draft is not None:
        d = load_or_measure(draft, remeasure)
        draft_cost["draft"] = d.get("draft_ms", d["ms"]["1"]) / t["ms"]["1"]   # profiles before draft_ms: full head
        rows["draft"] = CvCurve.measured(d.get("draft_cv", d["cv"]), source=str(profile_path(draft)))
    return Costs(cv=CvCurve.measured(t["cv"], source=str(profile_path(target))), draft_cost=draft_cost,
                 round_overhead=round_overhead, step_ms=t["ms"]["1"], rows=rows)
