"""The cost model of speculative decoding: expected tokens per round, speedup, best K, break-even α.

Time is measured in target decode steps: one plain greedy step of the target costs 1.0. A round with
K draft tokens costs K·draft_cost (the drafter, per proposed token) + c_v(K+1) (one target forward over
S = K+1 tokens) + a fixed per-round overhead, and emits on average E(α, K) tokens, where α is the
probability that a draft token is accepted given that the ones before it were.

c_v is either a constant (every verify forward costs the same, the seed's model) or a measured curve
{S: c_v(S)} as printed by `speczoo cv MODEL --json`, interpolated linearly between measured S and
extrapolated only a little beyond them.

Pure arithmetic: never runs a model or reads a clock; measured costs come in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from speczoo.decoding.tuning import PRICING


def expected_tokens(alpha: float, k: int) -> float:
    """E(α, K) = (1 − α^(K+1)) / (1 − α): tokens one round emits (accepted drafts + the target's own).

    K = 0 is a plain decode step (1 token); α = 1 gives K + 1.
    """
    _check_alpha(alpha)
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class CvCurve:
    """The cost of one target forward over S tokens, relative to a plain decode step (S = 1).

    Build with `CvCurve.constant(c)` (every verify forward costs c) or `CvCurve.measured({S: c})`.
    Call it: `curve(S) -> float`.
    """

    def __init__(self, points: Mapping[int, float] | None = None, constant: float | None = None,
                 source: str = ""):
        if (points is None) == (constant is None):
            raise ValueError("CvCurve needs either measured points or a constant, not both")
        self.constant_value = constant
        self.points: list[tuple[int, float]] = sorted(points.items()) if points is not None else []
        self.source = source

    @classmethod
    def constant(cls, c: float) -> CvCurve:
        if not (c > 0 and math.isfinite(c)):
            raise ValueError(f"a constant c_v must be a positive number, got {c}")
        return cls(constant=float(c), source=f"c_v={float(c)}")

    @classmethod
    def measured(cls, points: Mapping[int | str, float], source: str = "measured") -> CvCurve:
        """Points {S: cost of a forward over S tokens}; S = 1 must be present and is the unit.

        Values may be absolute (ms) or already relative: they are divided by the S = 1 value.
        Keys may be strings (as in JSON).
        """
        parsed: dict[int, float] = {}
        for key, value in points.items():
            try:
                s = int(key)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"c_v curve key {key!r} is not an integer token count S") from exc
            v = float(value)
            if s < 1:
                raise ValueError(f"c_v curve has S={s}; S counts tokens in a forward and must be >= 1")
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"c_v({s}) = {value!r}; every cost must be a positive number")
            parsed[s] = v
        if 1 not in parsed:
            raise ValueError("the c_v curve has no S=1 entry; it is the unit the others are relative "
                             "to. Measure it with `speczoo cv MODEL --json`.")
        unit = parsed[1]
        return cls(points={s: v / unit for s, v in parsed.items()}, source=source)

    @property
    def max_s(self) -> int | None:
        """The largest S this curve can answer for (None: any)."""
        if self.constant_value is not None:
            return None
        if len(self.points) < 2:
            return 1
        return int(self.points[-1][0] * PRICING.cv_reach)

    def __call__(self, s: int) -> float:
        if s < 1:
            raise ValueError(f"c_v is defined for forwards of S >= 1 tokens, got S={s}")
        if self.constant_value is not None:
            return self.constant_value
        pts = self.points
        for (s0, c0), (s1, c1) in zip(pts, pts[1:]):
            if s0 <= s <= s1:
                return c0 + (c1 - c0) * (s - s0) / (s1 - s0)
        if s == pts[-1][0]:
            return pts[-1][1]
        # Beyond the largest measured S: continue the last segment's slope (a forward never gets
        # cheaper with more tokens), but only up to Pricing.cv_reach × the largest S.
        max_s = self.max_s
        if len(pts) < 2 or s > max_s:
            measured = ", ".join(str(p[0]) for p in pts)
            raise ValueError(
                f"c_v({s}) cannot be inferred from a curve measured at S = {measured} "
                f"(extrapolation reaches S = {max_s}); measure larger S with `speczoo cv` or "
                f"lower --kmax")
        (s0, c0), (s1, c1) = pts[-2], pts[-1]
        slope = max(0.0, (c1 - c0) / (s1 - s0))
        return c1 + slope * (s - s1)

    def nondecreasing(self) -> CvCurve:
        """This curve with each point raised to the largest before it: a forward never gets cheaper with
        more rows, so a dip is timing noise, and read as it is it would price the extra rows (a prompt-lookup
        guess fed with a draft step, a deeper verify) as free or better."""
        if self.constant_value is not None:
            return self
        top, points = 0.0, {}
        for s, c in self.points:
            top = max(top, c)
            points[s] = top
        return CvCurve(points=points, source=self.source)

    def wide(self, s: int) -> float:
        """c_v(S) for a forward of any width (a catch-up over many ids): the curve as far as it may be
        read, then proportional to S (the cost of its largest readable S, per row)."""
        top = self.max_s
        return self(s) if top is None or s <= top else self(top) * s / top

    def __repr__(self) -> str:
        if self.constant_value is not None:
            return f"CvCurve.constant({self.constant_value:g})"
        return f"CvCurve.measured({dict(self.points)!r})"


def as_curve(cv: float | CvCurve | Mapping[int | str, float]) -> CvCurve:
    """Accept a constant, a {S: c_v} mapping or a CvCurve."""
    if isinstance(cv, CvCurve):
        return cv
    if isinstance(cv, Mapping):
        return CvCurve.measured(cv)
    return CvCurve.constant(float(cv))


@dataclass
class Costs:
    """Measured costs, in target decode steps (one plain greedy step of the target = 1.0).

    cv:             the target's forward cost over S tokens (a constant or a measured CvCurve).
    draft_cost:     per drafter name, the cost of proposing one token (n-gram ≈ 0; a draft model's
                    decode step relative to the target's, e.g. 0.71 for 0.5B drafting for 1.5B).
    round_overhead: fixed extra cost of a speculative round (draft bookkeeping, rollback, launching).
    step_ms:        the target's decode step these costs are relative to, in ms, when it was measured
                    (what online calibration, decoding/pricing/calibrate.py, needs; None: not known).
    A runtime's drafters come with their prices (their descriptors, decoding/drafters/registry.py); the
    engine writes them into draft_cost (`priced`).
    """

    cv: CvCurve | float
    draft_cost: dict[str, float] = field(default_factory=dict)
    round_overhead: float = 0.0
    step_ms: float | None = None

    def __post_init__(self) -> None:
        self.cv = as_curve(self.cv)
        for name, c in self.draft_cost.items():
            if not (c >= 0 and math.isfinite(c)):
                raise ValueError(f"draft cost of {name!r} must be a finite number >= 0, got {c}")
        if not (self.round_overhead >= 0 and math.isfinite(self.round_overhead)):
            raise ValueError(f"round_overhead must be >= 0, got {self.round_overhead}")
        if self.step_ms is not None and not (self.step_ms > 0 and math.isfinite(self.step_ms)):
            raise ValueError(f"step_ms must be a positive number of milliseconds, got {self.step_ms}")


    def priced(self, prices: Mapping[str, float]) -> Costs:
        """These costs with `prices` (drafter name -> its cost per proposed token) added to draft_cost,
        as a new value: a Costs that others hold never changes under them."""
        return Costs(cv=self.cv, draft_cost={**self.draft_cost, **prices}, round_overhead=self.round_overhead,
                     step_ms=self.step_ms)


def round_cost(k: int, cv: float | CvCurve, draft_cost: float = 0.0, overhead: float = 0.0) -> float:
    """Time of one round with K draft tokens, in target steps: K·draft_cost + c_v(K+1) + overhead."""
    if draft_cost < 0 or overhead < 0:
        raise ValueError(f"costs must be >= 0, got draft_cost={draft_cost}, overhead={overhead}")
    return k * draft_cost + as_curve(cv)(k + 1) + overhead


def speedup(alpha: float, k: int, cv: float | CvCurve, draft_cost: float = 0.0,
            overhead: float = 0.0) -> float:
    """Tokens per target step relative to plain decoding: E(α, K) / (K·draft_cost + c_v(K+1) + overhead)."""
    return expected_tokens(alpha, k) / round_cost(k, cv, draft_cost, overhead)


@dataclass
class BestK:
    k: int
    speedup: float
    expected: float     # E(α, k)


def best_k(alpha: float, cv: float | CvCurve, draft_cost: float = 0.0, k_max: int = 8,
           overhead: float = 0.0) -> BestK:
    """The K in 1..k_max with the highest speedup (ties: the smaller K)."""
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    curve = as_curve(cv)
    best: BestK | None = None
    for k in range(1, k_max + 1):
        s = speedup(alpha, k, curve, draft_cost, overhead)
        if best is None or s > best.speedup * (1 + 1e-12):
            best = BestK(k=k, speedup=s, expected=expected_tokens(alpha, k))
    assert best is not None
    return best


def ceiling(cv: Mapping[int | str, float]) -> BestK:
    """The most any lossless drafter can give at these measured verify costs: every draft token accepted and
    drafting free, a round of S = K+1 rows emits S tokens for c_v(S), so S / c_v(S) at the best measured S
    (ties: the smaller). No acceptance rate or drafter beats it; only cheaper wide forwards raise it."""
    points = {int(s): float(c) for s, c in cv.items() if int(s) >= 2}
    if not points:
        raise ValueError("the ceiling needs c_v measured at some S >= 2")
    s = max(sorted(points), key=lambda n: n / points[n] * (1 - 1e-12 * n))
    return BestK(k=s - 1, speedup=s / points[s], expected=float(s))


def break_even_alpha(cv: float | CvCurve, draft_cost: float = 0.0, k_max: int = 8,
                     overhead: float = 0.0, tol: float = 1e-6) -> float | None:
    """The smallest α at which the best K in 1..k_max reaches speedup 1; None if even α = 1 does not.

    Each K's speedup grows with α, so their maximum does too and bisection finds the threshold.
    """
    curve = as_curve(cv)

    def gain(a: float) -> float:
        return best_k(a, curve, draft_cost, k_max, overhead).speedup

    if gain(1.0) < 1.0:
        return None
    if gain(0.0) >= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if gain(mid) >= 1.0:
            hi = mid
        else:
            lo = mid
    return hi


def _check_alpha(alpha: float) -> None:
    if not (0.0 <= alpha <= 1.0):
        raise ValueError(f"acceptance rate α must be in [0, 1], got {alpha}")
