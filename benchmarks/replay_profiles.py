"""Cost profiles for the offline replay (auto_replay.py): the prices a kernel path puts on a round.

The recordings carry the costs measured when they were made, but `auto` must hold on every kernel path,
whatever its costs. A profile re-prices a recording (its tokens and confidences unchanged): PROFILES
holds three built-in shapes (cheap-verify, dear-verify, dear-draft; how each was chosen:
docs/tuning.md), the shapes `auto` must hold under; MEASURED holds machines' costs as measured
(zen4-1.5b, zen3-1.5b), and `load_profile` reads a measured one (a target's profile as
decoding/pricing/profile.py saves it, `speczoo cv MODEL --json` or a bundle's cost-<backend>.json, and
optionally the draft's). Pure data; it never runs a model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from speczoo.decoding.pricing.cost import CvCurve
from speczoo.decoding.tuning import PRICING

if TYPE_CHECKING:
    from benchmarks.auto_replay import Recording


@dataclass(frozen=True)
class Profile:
    """A machine's costs to replay recordings under, in target decode steps (one plain step = 1.0).

    target_cv:      the target's c_v(S) (S = 1 is 1.0).
    draft_step:     the draft model's step; None keeps each recording's.
    draft_cv:       the draft's own forward cost over S rows, in draft steps; None keeps the recording's.
    round_overhead: the fixed extra cost of a speculative round.
    """
    name: str
    target_cv: dict[int, float]
    draft_step: float | None = None
    draft_cv: dict[int, float] | None = None
    round_overhead: float = PRICING.round_overhead

    def __post_init__(self) -> None:
        CvCurve.measured(self.target_cv, source=self.name)          # raises on a malformed curve
        if self.draft_cv is not None:
            CvCurve.measured(self.draft_cv, source=self.name)
        if self.draft_step is not None and not 0.0 <= self.draft_step < 10.0:
            raise ValueError(f"profile {self.name}: a draft step of {self.draft_step} target steps is not a "
                             "cost; give it relative to one target decode step (0.3 = 30%)")

    def apply(self, rec: Recording) -> Recording:
        """The recording with this profile's prices (its tokens and confidences unchanged)."""
        return replace(rec, target_cv=dict(self.target_cv),
                       draft_cv=dict(rec.draft_cv if self.draft_cv is None else self.draft_cv),
                       draft_step=rec.draft_step if self.draft_step is None else self.draft_step,
                       round_overhead=self.round_overhead)

    def describe(self) -> str:
        cv = " ".join(f"{s}:{c:.2f}" for s, c in sorted(self.target_cv.items()))
        step = "the recordings'" if self.draft_step is None else f"{self.draft_step:.2f}"
        return f"profile {self.name}: c_v {{{cv}}}, draft step {step}, round overhead {self.round_overhead:g}"


# The three shapes a kernel path gives the costs. The draft's own rows follow the target's curve (both
# run on the same kernels; the controller's catch-up assumes as much). How each was chosen: docs/tuning.md.
ZEN4_CV = {1: 1.0, 2: 1.01, 3: 1.06, 5: 1.23, 9: 1.79, 17: 3.02}   # AVX-512 VNNI, `speczoo cv`, 2026-11-30
DEAR_CV = {1: 1.0, 2: 1.6, 3: 2.1, 5: 3.05, 9: 5.0, 17: 7.5}      # between llama.cpp's 0.5B and 1.5B curves
# Qwen2.5-Coder-1.5B on a 2-core Zen 4, quiet: `speczoo cv` c_v(S) and the reduced-head draft's r
# (docs/results.md, "The demo, c_v and r on a Zen 4, quiet", 2026-12-03)
ZEN4_15B_CV = {1: 1.0, 2: 1.15, 3: 1.22, 5: 1.56, 9: 2.69, 17: 4.66}
# the same on a 2-core Zen 3 (AVX2), quiet, and the 0.5B draft's own rows there (docs/tuning.md, "Profiles")
ZEN3_15B_CV = {1: 1.0, 2: 1.08, 3: 1.15, 5: 1.42, 9: 2.32, 17: 4.33}
ZEN3_05B_ROWS = {1: 1.0, 2: 1.22, 3: 1.27, 5: 1.64, 9: 2.75}
PROFILES = {
    # a verify of up to 5 rows costs about one step; the draft 0.28 of a step (the product's figures)
    "cheap-verify": Profile("cheap-verify", ZEN4_CV, 0.28, ZEN4_CV),
    # every verify row costs about half a step more (a slow path, or llama.cpp's own forward)
    "dear-verify": Profile("dear-verify", DEAR_CV, 0.35, DEAR_CV),
    # a cheap verify, but a draft step costs 0.8 of the target's (llama.cpp measured 0.71 for this pair)
    "dear-draft": Profile("dear-draft", ZEN4_CV, 0.8, ZEN4_CV),
}
MEASURED = {
    # the 1.5B as measured on this project's Zen 4, its draft (the 0.5B, reduced head) at r = 0.367
    "zen4-1.5b": Profile("zen4-1.5b", ZEN4_15B_CV, 0.367, ZEN4_15B_CV),
    # the 1.5B on a Zen 3 (AVX2), its draft at r = 0.34 over its own measured rows
    "zen3-1.5b": Profile("zen3-1.5b", ZEN3_15B_CV, 0.34, ZEN3_05B_ROWS),
}


def measured_profile(target: dict, draft: dict | None = None, name: str = "measured") -> Profile:
    """A profile from decoding/pricing/profile.py's saved form: the target's {"ms", "cv"}; the draft's step
    from the draft model's profile ("draft_ms", its reduced-head step, else its "ms" at S = 1), over the
    target's step, and its rows from its "draft_cv" (else "cv"), as runtime_costs prices them."""
    cv = _curve(target, "cv", name)
    if draft is None:
        return Profile(name, cv)
    t_ms, d_ms = _ms1(target, name), draft.get("draft_ms", _ms1(draft, name + " (draft)"))
    rows = _curve(draft, "draft_cv" if "draft_cv" in draft else "cv", name + " (draft)")
    return Profile(name, cv, float(d_ms) / t_ms, rows)


def _curve(data: dict, key: str, name: str) -> dict[int, float]:
    if not isinstance(data, dict) or not isinstance(data.get(key), dict):
        raise ValueError(f"{name}: no {key!r} table; expected a cost profile as decoding/pricing/profile.py "
                         'saves it ({"ms": {"1": ...}, "cv": {"1": 1.0, "2": ...}}: `speczoo cv MODEL --json`)')
    try:
        return {int(s): float(c) for s, c in data[key].items()}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: its {key!r} table must map S to a number, got {data[key]!r}") from exc


def _ms1(data: dict, name: str) -> float:
    ms = data.get("ms", {}).get("1") if isinstance(data.get("ms"), dict) else None
    if ms is None or not float(ms) > 0:
        raise ValueError(f"{name}: no positive \"ms\" at S = 1; the draft's step is priced against the "
                         "target's decode step, so both profiles need their times")
    return float(ms)


def load_profile(spec: str, draft_file: Path | None = None) -> Profile:
    """A built-in profile by name (a shape or a measured machine's), or a measured one from a target's profile
    file (and a draft's)."""
    named = {**PROFILES, **MEASURED}
    if spec in named:
        if draft_file is not None:
            raise ValueError(f"--draft-profile goes with a measured --profile FILE.json, not with {spec}")
        return named[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"unknown profile {spec!r}: name one of {', '.join(named)}, or give a cost "
                         "profile file (`speczoo cv MODEL --json > F.json`, or a bundle's cost-<backend>.json)")
    draft = json.loads(Path(draft_file).read_text()) if draft_file is not None else None
    return measured_profile(json.loads(path.read_text()), draft, name=path.name)
