"""Measure c_v(S): the cost of one target forward over S tokens relative to S = 1, and the cost profile
a runtime's controller starts from.

Speculation pays only when a verify forward over K+1 tokens costs about one decode step, so this
curve (with the draft cost) is what the cost model and the controller need. Each S is timed after a
prompt of `context` tokens already in the cache, rolled back after every forward, with warm-up and
the median of `repeats` runs, the S values interleaved so that machine noise spreads evenly.

The profile measured at a model's first load (load_or_measure) must announce itself on stderr with a
progress bar and take a bounded time on every kernel path. The full head and the draft head share one
prefill and one loop, and a budget bounds it all: a number of this machine's own decode steps (timed by a
probe first), so a slow or loaded CPU gets the time its forwards need, capped in seconds; no forward
starts that would end past it. Where even that cap cannot hold the whole profile (the scalar path), only
S = 1 and 3 are timed, without the prefill, and the other S are fitted on their line (listed under
"interpolated", and the profile under "fitted" says so in words; a draft head left no time for two sizes
is left out, its step then priced as the full head's). The profile is stored either way, atomically, under
a key (profile_key: bundle, backend, kernel path, threads, COST_FORMAT), and every later load with that
key reads it instead of timing anything. A fitted start is enough because the engine re-prices these
costs from its own timings as it generates (decoding/pricing/calibrate.py): the profile is only where it
starts. Before the curve, the profile chooses whether the kernels prefetch the weights in software in a
one-row forward, timing both (pricing/one_row.py: the faster depends on the CPU), and stores the choice, which
every load sets on the model. `speczoo cv` has no budget and times every S it is asked for. A loaded model
comes in as an argument (anything with .model, .args, .name, .backend, .path, the bundle it stores its
profile in, and .bundle_id, that bundle's identity): this module never imports the runtime that loads it,
nor the drafters (they price themselves with this package), whose reduced draft head comes in as
`draft_head`.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from speczoo.cache import KVCache
from speczoo.decoding.pricing.cost import Costs, CvCurve
from speczoo.decoding.pricing.one_row import OneRowTiming, time_one_row
from speczoo.decoding.tuning import DRAFTING, PRICING, Pricing
from speczoo.kernels import native
from speczoo.kernels.quantized import is_compiled
from speczoo.models.forward import Readout


@dataclass
class CvResult:
    ms: dict[int, float]        # S -> median milliseconds per forward
    interpolated: tuple[int, ...] = ()   # S values not timed but fitted (budgeted profiles only)

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
    """Time a forward over each of `sizes` rows after `context` random tokens, `repeats` times after
    `warmup` (model, args: a loaded model and its ModelArgs). head: an LM-head stand-in for the forward (a
    draft's reduced head, see decoding/drafters/draft_head.py)."""
    return measure_series(model, args, {"": Series(tuple(sizes), head)}, context, repeats, warmup, seed)[""]


def measure_series(model, args, series: Mapping[str, Series], context: int = 64, repeats: int = 7,
                   warmup: int = 2, seed: int = 0, budget: StepBudget | None = None, bar=None) -> dict[str, CvResult]:
    """Time every series after one shared prefill of `context` random tokens, interleaved; bar: a tqdm
    bar to advance per forward.

    budget (None: none): see _budgeted; it is then set to the seconds it came to. A series that got fewer
    than two sizes timed within it (a draft head after a slow target) is left out of the result: one point
    cannot tell a forward's fixed cost from its cost per row.
    """
    want = {name: sorted({1, *ser.sizes}) for name, ser in series.items()}
    run = _Forwards(model, args, series, context + max(max(s) for s in want.values()) + 1, seed)
    with torch.inference_mode():
        if budget is None:
            run.extend(context)
            times = run.passes(want, warmup, repeats, bar)
        else:
            times = _budgeted(run, want, context, repeats, warmup, budget, bar)
    return {name: _result(times[name], want[name]) for name in want
            if budget is None or sum(map(bool, times[name].values())) >= 2}


def _budgeted(run: _Forwards, want: dict[str, list[int]], context: int, repeats: int, warmup: int,
              budget: StepBudget, bar) -> dict[str, dict[int, list[float]]]:
    """Time within the budget, counted from now. A cold 1-row forward first (the first touch of every
    weight), then the first series' S = 1 and 3, whatever the budget (one point cannot tell a slow path,
    where a forward costs about its rows, from a busy machine, where it costs about the same for any S):
    S = 1 sets the budget's seconds (its steps), and the line through them prices every later forward.
    When warm-up plus one pass of every size fits, prefill the context and time them all; else keep those
    two, without the prefill, and time S = 1 and 3 of the other series. Either way, no later forward
    starts that the line says would end past the budget."""
    budget.start()
    first = next(iter(want))
    run.extend(1)
    probe = {first: {1: [run.time(first, 1)], 3: [run.time(first, 3)]}}
    budget.line(probe[first][1][0], probe[first][3][0])
    one_pass = sum(budget.ms(s) for sizes in want.values() for s in sizes)
    if budget.fits_ms((warmup + 1) * one_pass + budget.ms(context - 1)):
        run.extend(context - 1)
        times = run.passes(want, warmup, repeats, bar, budget)
        for s in (1, 3):                     # never without the unit, nor with one point alone
            times[first][s] = times[first].get(s) or probe[first][s]
        return times
    slow = {name: [1, 3] for name in sorted(want, key=lambda n: n == first)}    # the others first: probed already
    return run.passes(slow, 0, repeats, bar, budget, start=probe)


class StepBudget:
    """A profile's time budget: `steps` decode steps as the probe times one, `max_s` seconds at the most
    (Pricing.profile_budget_steps and profile_budget_max_s), counted from start(); and the line
    ms(S) = a + b (S - 1) that prices the next forward against it. `seconds` is what it came to (None
    before the probe)."""

    def __init__(self, steps: float, max_s: float):
        self.steps, self.max_s = steps, max_s
        self.a = self.b = 0.0
        self.seconds: float | None = None
        self.begun: float | None = None

    @classmethod
    def of(cls, pricing: Pricing) -> StepBudget:
        return cls(pricing.profile_budget_steps, pricing.profile_budget_max_s)

    def start(self) -> None:
        """Start counting now, unless already started (the one-row choice runs on the profile's budget)."""
        if self.begun is None:
            self.begun = time.perf_counter()

    def line(self, ms1: float, ms3: float) -> None:
        self.a, self.b = ms1, max(0.0, (ms3 - ms1) / 2)
        self.seconds = min(self.max_s, self.steps * ms1 / 1000)

    def ms(self, s: int) -> float:
        return self.a + self.b * (s - 1)

    def fits_ms(self, ms: float) -> bool:
        assert self.seconds is not None and self.begun is not None, "the probe sets the budget"
        return time.perf_counter() + ms / 1000 <= self.begun + self.seconds

    def fits(self, s: int) -> bool:
        return self.fits_ms(self.ms(s))

    def describe(self) -> str:
        """The budget in words, as the probe set it."""
        steps = f"{self.steps:g} steps of {self.a:.0f} ms"
        if self.seconds is not None and self.seconds >= self.max_s:
            return f"{self.max_s:g} s (the cap: {steps} would be {self.steps * self.a / 1000:.0f} s)"
        return f"{self.seconds or 0:.0f} s ({steps})"


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
        self.model(toks, pos, self.cache, readout=Readout(head=self.series[name].head))
        dt = (time.perf_counter() - start) * 1000
        self.cache.truncate(self.context)
        return dt

    def passes(self, plans: dict[str, list[int]], warmup: int, repeats: int, bar, budget: StepBudget | None = None,
               start: dict[str, dict[int, list[float]]] | None = None) -> dict[str, dict[int, list[float]]]:
        """Times {series: {S: [ms]}} of `warmup` + `repeats` passes over every series' sizes, interleaved,
        added to `start`; with a budget, it ends at the first forward that would overrun it."""
        start = start or {}
        times = {name: {s: list(start.get(name, {}).get(s, [])) for s in sizes} for name, sizes in plans.items()}
        _set_total(bar, sum(map(len, plans.values())) * (warmup + repeats))
        for rep in range(warmup + repeats):
            for name, sizes in plans.items():
                for s in sizes:
                    if budget is not None and not budget.fits(s):
                        _set_total(bar, bar.n if bar is not None else 0)
                        return times
                    dt = self.time(name, s)
                    if rep >= warmup:
                        times[name][s].append(dt)
                    if bar is not None:
                        bar.update()
        return times


def _set_total(bar, total: int) -> None:
    if bar is not None:
        bar.total = total
        bar.refresh()


def _result(times: dict[int, list[float]], sizes: list[int]) -> CvResult:
    """Medians of the timed sizes; the others (two timed at the least) on the line through their timed
    neighbours (beyond the largest timed S: its last segment's slope, never falling)."""
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

# The draft head's size (its common ids; None: the full head) a profile's draft curve was timed through.
DraftVocab = int | None

# The reduced LM head of that size a model drafts with (drafters/draft_model.py's `reduced_head`), or None:
# the draft curve is timed through it. Handed in by the caller, since the drafters price themselves with
# this package.
HeadFor = Callable[[nn.Module, DraftVocab], "nn.Module | None"]


# What a stored profile holds and how it is timed: a profile of another format is timed again.
COST_FORMAT = 3


def one_row_choice(loaded, max_s: float | None = None) -> OneRowTiming | None:
    """Time the model's one-row forward with and without the kernels' software prefetch (pricing/one_row.py),
    within PRICING's one_row_* bounds (and max_s seconds when given), and leave the model set to the faster;
    None where its linears are not the compiled kernels' (nothing to choose) or the time allowed no choice.
    No prompt before it: the prefetch is the weights' stream, which a few cached keys do not change, and a
    slow path's prefill would take the time the choice has."""
    if not any(is_compiled(m) for m in loaded.model.modules()):
        return None
    run = _Forwards(loaded.model, loaded.args, {"": Series((1,))}, 2, seed=1)
    with torch.inference_mode():
        return time_one_row(loaded.model, lambda: run.time("", 1), PRICING, max_s)


def use_one_row(loaded, data: dict) -> None:
    """Set the model's one-row prefetch as its profile `data` chose (the default, none, where it chose nothing)."""
    timing = OneRowTiming.from_json(data.get("one_row"))
    loaded.model.one_row_prefetch = timing is not None and timing.prefetch


def profile_key(loaded, draft_vocab: DraftVocab = DRAFTING.head_vocab) -> dict:
    """What a stored profile is valid for: the bundle it timed (its identity changes when it is pulled or
    packed again), the backend, the kernel path (a forced SPECZOO_KERNEL_PATH, or the bundle on another
    CPU, measures its own), the compiled kernels' build (native.build_id: an upgrade that changed them times
    again what the old ones cost), the thread count, the draft head's size its draft curve was timed
    through and this module's COST_FORMAT. A stored profile of another key is timed again."""
    return {"cost_format": COST_FORMAT, "bundle": loaded.bundle_id, "backend": loaded.backend,
            "kernel_path": native.chosen_path().name, "kernels": _kernels_built(),
            "threads": torch.get_num_threads(), "draft_vocab": draft_vocab}


def _kernels_built() -> str:
    """The compiled kernels' build id, or "none" where no compiler builds them (a torch-only backend)."""
    try:
        return native.build_id()
    except native.KernelBuildError:
        return "none"


def profile_path(loaded, draft_vocab: DraftVocab = DRAFTING.head_vocab) -> Path:
    """Where the bundle keeps its profile: one per backend, kernel path, thread count and (when not the
    default) draft head size, so that switching among them keeps each one's profile (profile_key says
    what else it must match)."""
    head = "" if draft_vocab == DRAFTING.head_vocab else f"-dv{draft_vocab or 'full'}"
    return loaded.path / f"cost-{loaded.backend}-{native.chosen_path().name}-t{torch.get_num_threads()}{head}.json"


def read_profile(loaded, draft_vocab: DraftVocab = DRAFTING.head_vocab) -> tuple[dict | None, str]:
    """The stored profile when its key is this runtime's, else None and why not, in words."""
    import json

    path = profile_path(loaded, draft_vocab)
    if not path.is_file():
        return None, "none stored"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"{path} is unreadable ({e})"
    key, stored = profile_key(loaded, draft_vocab), data.get("key") if isinstance(data, dict) else None
    if stored != key:
        old = stored if isinstance(stored, dict) else {}
        diff = [f"{k} {old.get(k, '?')} -> {v}" for k, v in key.items() if old.get(k) != v]
        return None, f"the stored one was timed for another setup ({', '.join(diff)})"
    return data, ""


def load_or_measure(loaded, remeasure: bool = False, budget: StepBudget | None = None,
                    draft_head: HeadFor | None = None, draft_vocab: DraftVocab = DRAFTING.head_vocab) -> dict:
    """The model's cost profile {"ms": {S: ms}, "cv": {S: c_v}} on its backend, cached in the bundle,
    plus "draft_ms": its decode step when drafting with the reduced-vocabulary head (when it has one).

    Timed once, the first time a runtime needs it (announced on stderr with a progress bar), within
    `budget` (default: StepBudget.of(PRICING), a number of this machine's own decode steps, so a slow or
    loaded CPU gets the time its forwards need), and stored (profile_key says when it is timed again);
    every later load reads it. A profile the budget cut short (a slow kernel path, past
    Pricing.profile_budget_max_s) is stored too, with what was fitted instead of timed under "fitted",
    and says so on stderr: `speczoo cv NAME --save` times it all. remeasure=True (benches, `speczoo demo
    --remeasure-costs`: the controller should see the machine as it is now) times it afresh for this
    process only and leaves the stored profile alone, so one run on a loaded machine cannot skew every
    later run's controller. draft_head: see HeadFor (None: no draft curve is measured); draft_vocab: the
    size draft_head reduces to, which keys the stored profile (another size is timed once and stored
    beside it).
    """
    stored, why_not = read_profile(loaded, draft_vocab)
    if stored is not None and not remeasure:
        use_one_row(loaded, stored)
        return stored
    budget = StepBudget.of(PRICING) if budget is None else budget
    path = profile_path(loaded, draft_vocab)
    data, cut = measure_profile(loaded, budget, why=_why(loaded, remeasure, why_not, path), draft_head=draft_head,
                                draft_vocab=draft_vocab)
    if cut:
        data["fitted"] = cut
        kept = "for this run only (not stored)" if remeasure else f"stored so, in {path}"
        print(f"speczoo: {loaded.name}'s forwards were too slow to time everything within {budget.describe()}; "
              f"{'; '.join(cut)}, {kept}. `speczoo cv {loaded.name} --save` times and stores it all.",
              file=sys.stderr, flush=True)
    if remeasure:
        return data
    try:
        return write_profile(loaded, data, draft_vocab)
    except OSError as e:           # a read-only bundle: this run prices from it all the same
        print(f"speczoo: could not store {loaded.name}'s cost profile ({e}); it is timed again next run",
              file=sys.stderr, flush=True)
        return data


def _why(loaded, remeasure: bool, why_not: str, path: Path) -> str:
    if remeasure:
        return (f"timing {loaded.name} ({loaded.backend}) afresh for this run's cost profile: a bench prices "
                "speculation at this machine's present speed")
    return (f"timing {loaded.name} ({loaded.backend}) once for its cost profile ({why_not}): speculation is priced "
            f"from what a forward over 1-{max(PROFILE_SIZES)} tokens costs on this machine (stored in "
            f"{path}; later runs read it)")


def measure_profile(loaded, budget: StepBudget | None = None, why: str | None = None,
                    draft_head: HeadFor | None = None, draft_vocab: DraftVocab = DRAFTING.head_vocab,
                    ) -> tuple[dict, list[str]]:
    """Choose the model's one-row prefetch (one_row_choice), then time the profile's target curve and, when
    draft_head gives the model a reduced draft head, its draft curve, in one loop, within budget (None: no
    budget); `why` (when given) is announced on stderr, with the choice and a progress bar. Returns the
    profile and what the budget cut short, in words ([] when nothing)."""
    from tqdm import tqdm

    series = {"target": Series(tuple(PROFILE_SIZES))}
    head = draft_head(loaded.model, draft_vocab) if draft_head is not None else None
    if head is not None:
        series["draft"] = Series(tuple(DRAFT_SIZES), head)
    if why is not None:
        print(f"speczoo: {why}", file=sys.stderr, flush=True)
    if budget is not None:                    # the choice's time is the profile's: its budget counts from here
        budget.start()
    # first, so that the curves are timed the way the model will run; on a quarter of the budget's cap at most
    one_row = one_row_choice(loaded, None if budget is None else budget.max_s / 4)
    if one_row is not None and why is not None:
        print(f"speczoo: {one_row.describe()}", file=sys.stderr, flush=True)
    planned = (1 + PROFILE_REPEATS) * sum(len(s.sizes) for s in series.values())     # until the probe says
    with tqdm(total=planned, desc="cost profile", unit="forward", file=sys.stderr, disable=why is None,
              leave=False) as bar:
        res = measure_series(loaded.model, loaded.args, series, PROFILE_CONTEXT, PROFILE_REPEATS, warmup=1,
                             budget=budget, bar=bar)
    cut = [f"{name} c_v({', '.join(map(str, r.interpolated))}) fitted" for name, r in res.items() if r.interpolated]
    if "draft" in series and "draft" not in res:
        cut.append("no time for the draft head: its step priced as the full head's")
    return _profile(loaded, res["target"], res.get("draft"), one_row), cut


def profile_data(loaded, res: CvResult, repeats: int = 3, draft_head: HeadFor | None = None,
                 draft_vocab: DraftVocab = DRAFTING.head_vocab, one_row: OneRowTiming | None = None) -> dict:
    """The profile to store: the c_v table `res` (timed after one_row_choice set the model, whose timing
    `one_row` is stored beside it), plus, when draft_head gives the model a reduced draft head, its draft step
    ("draft_ms") and that forward's cost over S rows ("draft_cv", which sizes its guesses), timed now with
    `repeats` runs."""
    head = draft_head(loaded.model, draft_vocab) if draft_head is not None else None
    d = None
    if head is not None:
        d = measure_cv(loaded.model, loaded.args, DRAFT_SIZES, context=PROFILE_CONTEXT, repeats=repeats, warmup=1,
                       head=head)
    return _profile(loaded, res, d, one_row)


def _profile(loaded, target: CvResult, draft: CvResult | None, one_row: OneRowTiming | None) -> dict:
    data = target.to_json(loaded.name, loaded.backend)
    if one_row is not None:
        data["one_row"] = one_row.to_json()
    if draft is not None:
        data["draft_ms"] = round(draft.ms[1], 3)
        data["draft_cv"] = {str(s): round(c, 4) for s, c in draft.cv.items()}
        if draft.interpolated:
            data["draft_interpolated"] = list(draft.interpolated)
    return data


def write_profile(loaded, data: dict, draft_vocab: DraftVocab = DRAFTING.head_vocab) -> dict:
    """Store `data` as the model's profile, under this runtime's profile_key, atomically (a temporary file
    beside it, then renamed over it, so a reader never sees half a profile); returns what it stored."""
    import json
    import os
    import tempfile

    path = profile_path(loaded, draft_vocab)
    data = {**data, "key": profile_key(loaded, draft_vocab)}
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)              # as a plain write would make it, not mkstemp's 0600
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return data


@dataclass(frozen=True)
class DraftModelCosts:
    """A draft model's measured costs beside its target's.

    step: its draft step (through the reduced head when profiled so) in target decode steps: the "draft"
          drafter's price (its descriptor's cost).
    rows: its forward cost over S rows relative to one row (its own c_v curve), which sizes its
          prompt-lookup guesses (decoding/drafters/guess.py).
    """

    step: float
    rows: CvCurve


def runtime_costs(target, draft=None, remeasure: bool = False, draft_head: HeadFor | None = None,
                  pricing: Pricing = PRICING, draft_vocab: DraftVocab = DRAFTING.head_vocab,
                  ) -> tuple[Costs, DraftModelCosts | None]:
    """The costs a runtime prices with: the target's profile as Costs (its c_v curve and decode step, the
    round overhead; no drafter's price: each drafter's descriptor carries its own), and the draft
    model's costs (None without one). target, draft: loaded models (see the module docstring);
    draft_head: see HeadFor; draft_vocab: the size it reduces the draft's head to. Only the draft's
    profile depends on it: the target's is read (or timed) with the default size, so another draft head
    size never times the target again."""
    t = load_or_measure(target, remeasure, draft_head=draft_head)
    costs = Costs(cv=CvCurve.measured(t["cv"], source=str(profile_path(target))).nondecreasing(),
                  round_overhead=pricing.round_overhead, step_ms=t["ms"]["1"])
    if draft is None:
        return costs, None
    d = load_or_measure(draft, remeasure, draft_head=draft_head, draft_vocab=draft_vocab)
    step = d.get("draft_ms", d["ms"]["1"]) / t["ms"]["1"]          # profiles before draft_ms: the full head
    rows = CvCurve.measured(d.get("draft_cv", d["cv"]), source=str(profile_path(draft, draft_vocab)))
    return costs, DraftModelCosts(step, rows.nondecreasing())
