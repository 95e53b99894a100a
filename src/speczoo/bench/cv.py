"""Measure c_v(S): the cost of one target forward over S tokens relative to S = 1, and the cost profile
a runtime's controller starts from.

Speculation pays only when a verify forward over K+1 tokens costs about one decode step, so this
curve (with the draft cost) is what the cost model and the controller need. Each S is timed after a
prompt of `context` tokens already in the cache, rolled back after every forward, with warm-up and
the median of `repeats` runs, the S values interleaved so that machine noise spreads evenly.

The profile measured at a model's first load (load_or_measure) must announce itself on stderr with a
progress bar and finish in seconds on every kernel path, never minutes: the full head and the draft head
share one prefill and one loop, repeats stop once a time budget is spent, and where a probe says a
forward costs about its rows (a scalar path: the 0.5B's 40-token prefill took 22-29 s on it, a 9-row
forward 3.4-4.1 s), only S = 1 and 3 are timed, without the prefill, and the larger S are fitted on
their line (the profile lists them under "interpolated"). That is enough because the engine re-prices
these costs from its own timings as it generates (spec/calibrate.py): the profile is only where it
starts. `speczoo cv` has no budget and times every S it is asked for.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from speczoo.cache import KVCache


@dataclass
class CvResult:
    ms: dict[int, float]        # S -> median milliseconds per forward
    interpolated: tuple[int, ...] = ()   # S values not timed but interpolated (budgeted profiles only)

    @property
    def cv(self) -> dict[int, float]:
        return {s: t / self.ms[1] for s, t in self.ms.items()}

    def to_json(self, model: str, backend: str) -> dict:
        data = {"model": model, "backend": backend, "ms": {str(s): round(t, 3) for s, t in self.ms.items()},
                "cv": {str(s): round(c, 4) for s, c in self.cv.items()}}
        if self.interpolated:
            data["interpolated"] = list(self.interpolated)
        return data


@dataclass(frozen=True)
class Series:
    """One curve to time: forwards over each of `sizes` rows through `head` (None: the model's own)."""

    sizes: tuple[int, ...]
    head: object = None


def measure_cv(model, args, sizes: list[int], context: int = 64, repeats: int = 7, warmup: int = 2,
               seed: int = 0, head=None) -> CvResult:
    """head: an LM-head stand-in for the forward (a draft's reduced head, see spec/drafters/draft_head.py)."""
    return measure_series(model, args, {"": Series(tuple(sizes), head)}, context, repeats, warmup, seed)[""]


def measure_series(model, args, series: Mapping[str, Series], context: int = 64, repeats: int = 7,
                   warmup: int = 2, seed: int = 0, budget_s: float | None = None, bar=None) -> dict[str, CvResult]:
    """Time every series after one shared prefill of `context` random tokens, interleaved.

    budget_s (None: none): first probe a 1- and a 3-row forward; when they say that warm-up plus one
    pass of every size would overrun the budget (a slow kernel path, where a forward costs about its
    rows), time only S = 1 and 3 of each series right after the probe, without the prefill, and fit the
    larger S on that line; else prefill and time every size. Either way, stop repeating once another
    pass would overrun the budget (one measured pass at the least). bar: a tqdm bar to advance per forward.
    """
    want = {name: sorted({1, *ser.sizes}) for name, ser in series.items()}
    run = _Forwards(model, args, series, context + max(max(s) for s in want.values()) + 1, seed)
    plans = want
    t0 = time.perf_counter()
    with torch.inference_mode():
        if budget_s is None:
            run.extend(context)
        else:
            first = next(iter(want))
            run.extend(1)                                   # cold: the first touch of every weight
            t1, t3 = run.time(first, 1) / 1000, run.time(first, 3) / 1000
            slope = max(0.0, (t3 - t1) / 2)
            one_pass = sum(t1 + slope * (s - 1) for sizes in want.values() for s in sizes)
            if (warmup + 1) * one_pass + t1 + slope * (context - 2) > budget_s - (time.perf_counter() - t0):
                plans = {name: [1, 3] for name in want}
                warmup = 0
            else:
                run.extend(context - 1)
        times = {name: {s: [] for s in sizes} for name, sizes in plans.items()}
        _set_total(bar, sum(map(len, plans.values())) * (warmup + repeats))
        for rep in range(warmup + repeats):
            pass_start = time.perf_counter()
            for name, sizes in plans.items():
                for s in sizes:
                    dt = run.time(name, s)
                    if rep >= warmup:
                        times[name][s].append(dt)
                    if bar is not None:
                        bar.update()
            now = time.perf_counter()
            if budget_s is not None and rep >= warmup and (now - t0) + (now - pass_start) > budget_s:
                if bar is not None:
                    _set_total(bar, bar.n)
                break
    return {name: _result(times[name], want[name]) for name in want}


class _Forwards:
    """Random-token forwards after a context in one cache, each rolled back after it is timed."""

    def __init__(self, model, args, series: Mapping[str, Series], capacity: int, seed: int):
        self.model, self.vocab, self.series = model, args.vocab_size, series
        self.g = torch.Generator().manual_seed(seed)
        self.cache = KVCache(args, capacity)
        self.context = 0

    def _tokens(self, n: int):
        return torch.randint(0, self.vocab, (n,), generator=self.g), torch.arange(self.context, self.context + n)

    def extend(self, n: int) -> None:
        """Append n random tokens to the context (a prefill)."""
        if n > 0:
            self.model(*self._tokens(n), self.cache)
            self.context += n

    def time(self, name: str, s: int) -> float:
        """Milliseconds of one forward over s rows through the series' head, then rolled back."""
        toks, pos = self._tokens(s)
        start = time.perf_counter()
        self.model(toks, pos, self.cache, head=self.series[name].head)
        dt = (time.perf_counter() - start) * 1000
        self.cache.truncate(self.context)
        return dt


def _set_total(bar, total: int) -> None:
    if bar is not None:
        bar.total = total
        bar.refresh()


def _result(times: dict[int, list[float]], sizes: list[int]) -> CvResult:
    """Medians of the timed sizes; the others on the line through their timed neighbours (beyond the
    largest timed S: its last segment's slope, never falling)."""
    timed = {s: statistics.median(v) for s, v in times.items() if v}
    points = sorted(timed.items())
    ms = {}
    for s in sizes:
        if s in timed:
            ms[s] = timed[s]
            continue
        (s0, m0), (s1, m1) = next(((a, b) for a, b in zip(points, points[1:]) if a[0] < s < b[0]), points[-2:])
        line = m0 + (m1 - m0) * (s - s0) / (s1 - s0)
        ms[s] = max(line, m1) if s > s1 else line
    return CvResult(ms, tuple(s for s in sizes if s not in timed))


PROFILE_SIZES = [1, 2, 3, 5, 9, 17]
DRAFT_SIZES = [1, 2, 3, 5, 9]     # rows of a draft forward: a step with up to 8 prompt-lookup guesses
PROFILE_CONTEXT = 64
PROFILE_REPEATS = 3
# Wall-clock budget of a first-load profile (all of it, the draft head's forwards included). On the
# AVX-512 path the 1.5B's whole profile (warm-up + 3 passes) takes about 2 s; a slow path stops early.
PROFILE_BUDGET_S = 6.0


def profile_path(loaded) -> Path:
    return loaded.path / f"cost-{loaded.backend}.json"


def load_or_measure(loaded, remeasure: bool = False, budget_s: float = PROFILE_BUDGET_S) -> dict:
    """The model's cost profile {"ms": {S: ms}, "cv": {S: c_v}} on its backend, cached in the bundle,
    plus "draft_ms": its decode step when drafting with the reduced-vocabulary head (when it has one).

    Measured once (seconds, within `budget_s`, announced on stderr with a progress bar) the first time
    a runtime needs it, then read back; `speczoo cv MODEL --save` re-measures and stores it (do that on
    a quiet machine: a busy one inflates every figure). remeasure=True (benches: the controller should
    see the machine as it is now) measures afresh for this process only and leaves a stored profile
    alone, so one run on a loaded machine cannot skew every later run's controller.
    """
    import json

    path = profile_path(loaded)
    if path.is_file() and not remeasure:
        return json.loads(path.read_text())
    data = measure_profile(loaded, budget_s, why=_why(loaded, stored=path.is_file()))
    if not path.is_file():
        write_profile(loaded, data)
    return data


def _why(loaded, stored: bool) -> str:
    if stored:
        return (f"timing {loaded.name} ({loaded.backend}) afresh for this run's cost profile: a bench prices "
                "speculation at this machine's present speed")
    return (f"timing {loaded.name} ({loaded.backend}) once for its cost profile: speculation is priced from what "
            f"a forward over 1-{max(PROFILE_SIZES)} tokens costs on this machine (stored in {profile_path(loaded)})")


def measure_profile(loaded, budget_s: float | None = PROFILE_BUDGET_S, why: str | None = None) -> dict:
    """Time the profile's target curve and, when the model has a reduced draft head, its draft curve,
    in one loop; `why` (when given) is announced on stderr with a progress bar."""
    from tqdm import tqdm

    series = {"target": Series(tuple(PROFILE_SIZES))}
    head = draft_head(loaded)
    if head is not None:
        series["draft"] = Series(tuple(DRAFT_SIZES), head)
    if why is not None:
        print(f"speczoo: {why}", file=sys.stderr, flush=True)
    with tqdm(desc="cost profile", unit="forward", file=sys.stderr, disable=why is None, leave=False) as bar:
        res = measure_series(loaded.model, loaded.args, series, PROFILE_CONTEXT, PROFILE_REPEATS, warmup=1,
                             budget_s=budget_s, bar=bar)
    return _profile(loaded, res["target"], res.get("draft"))


def profile_data(loaded, res: CvResult, repeats: int = 3) -> dict:
    """The profile to store: the c_v table `res`, plus, when the model has a reduced draft head, its
    draft step ("draft_ms") and that forward's cost over S rows ("draft_cv", which sizes its guesses),
    timed now with `repeats` runs."""
    head = draft_head(loaded)
    d = None
    if head is not None:
        d = measure_cv(loaded.model, loaded.args, DRAFT_SIZES, context=PROFILE_CONTEXT, repeats=repeats, warmup=1,
                       head=head)
    return _profile(loaded, res, d)


def _profile(loaded, target: CvResult, draft: CvResult | None) -> dict:
    data = target.to_json(loaded.name, loaded.backend)
    if draft is not None:
        data["draft_ms"] = round(draft.ms[1], 3)
        data["draft_cv"] = {str(s): round(c, 4) for s, c in draft.cv.items()}
        if draft.interpolated:
            data["draft_interpolated"] = list(draft.interpolated)
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
