"""Online calibration: the controller's costs kept in step with what the engine's rounds really take.

A stored cost profile is measured once, but a machine's speed moves under it within minutes (how much:
docs/tuning.md), and costs fitted to the wrong state pick the wrong drafter and K. The engine times
every decode forward of the target (S tokens) and every proposal; this meter keeps a running mean per
S and per drafter and turns them back into `Costs`, in target decode steps as the controller wants them:
  * ms(S) is the running mean where S has been seen often enough, else the profile's ms(S) scaled by
    the observed/profile ratio of the nearest S that has been seen (the profile alone before that);
  * c_v(S) = ms(S) / ms(1), made non-decreasing in S (noise can make a 2-token forward look cheaper
    than a 1-token one); a drafter's cost per proposed token = its running ms per step / ms(1). A step
    is a token, or, for a draft model fed prompt-lookup guesses, a one-row forward (Draft.work): its
    ms per drafted token falls wherever the text copies itself, and priced so, every token of the draft
    model would look that cheap to the controller.
A drafter is timed only when it drafts, and a forward size only when the controller drafts that deep, so
a price measured in a bad moment would lock either out for good (the controller stops choosing it, and
nothing measures it again): its evidence fades with the target forwards run since its last measurement,
and once too little is left, the profile's price stands again (for a size: the profile's scaled by the
nearest size still measured) and the controller may try it once more.
Pure bookkeeping: the engine hands in seconds, the controller gets Costs; neither clock nor model here.
"""

from __future__ import annotations

import math

from speczoo.decoding.pricing.cost import Costs, CvCurve
from speczoo.decoding.tuning import PRICING, Pricing

SIZES = (1, 2, 3, 5, 9, 17)   # forward sizes the curve is given at when the profile is a constant c_v


class _Mean:
    """An exponentially weighted running mean."""

    def __init__(self, half_life: float):
        self.decay = 0.5 ** (1.0 / half_life)
        self.total = 0.0
        self.weight = 0.0

    def add(self, x: float, n: float = 1.0) -> None:
        f = self.decay ** n
        self.total = f * self.total + x * n
        self.weight = f * self.weight + n

    @property
    def value(self) -> float:
        return self.total / self.weight


class CostMeter:
    """Running costs of the target's forwards and the drafters' proposals, from measured seconds.

    profile: the stored costs, with `step_ms` (the decode step they are relative to) set.
    pricing: the calibration's constants (Pricing: half_life, min_weight, stale_half_life, and when the
             rounds hand the controller new costs, recalibrate_every and in_step_lag).
    """

    def __init__(self, profile: Costs, pricing: Pricing = PRICING):
        if profile.step_ms is None:
            raise ValueError("calibrating needs the profile's decode step in ms (Costs.step_ms)")
        self.profile = profile
        self.pricing = pricing
        self.half_life, self.min_weight = pricing.half_life, pricing.min_weight
        self.forwards: dict[int, _Mean] = {}
        self.drafts: dict[str, _Mean] = {}
        self.n_forwards = 0                        # target forwards timed so far
        self.forwarded_at: dict[int, int] = {}     # S -> n_forwards at its latest measurement
        self.drafted_at: dict[str, int] = {}       # drafter -> n_forwards at its latest measurement

    def forward(self, s: int, seconds: float) -> None:
        """A decode-time target forward over `s` tokens took `seconds`."""
        if s >= 1 and seconds > 0 and math.isfinite(seconds):
            self._joined(self.forwards, self.forwarded_at, s).add(seconds * 1e3)
            self.n_forwards += 1
            self.forwarded_at[s] = self.n_forwards

    def draft(self, name: str, steps: float, seconds: float) -> None:
        """Drafter `name` did `steps` of its own steps in `seconds` (a proposal without catch-up: one step
        per token, or Draft.work). Drafters the profile counts as free (prompt lookup) stay free: their
        microseconds are round overhead."""
        if steps > 0 and seconds > 0 and math.isfinite(seconds) and self.profile.draft_cost.get(name, 0.0) > 0:
            self._joined(self.drafts, self.drafted_at, name).add(seconds * 1e3 / steps, steps)
            self.drafted_at[name] = self.n_forwards

    def _joined(self, means: dict, at: dict, key) -> _Mean:
        """The running mean a new measurement of `key` joins: a fresh one when there is none, or when the
        evidence it held has faded (a stale price is not averaged into the new one)."""
        m = means.get(key)
        if m is None or self._evidence(m, at[key]) < self.min_weight <= m.weight:
            m = means[key] = _Mean(self.half_life)
        return m

    def _evidence(self, m: _Mean, at: int) -> float:
        """The weight of a running mean last added to at forward number `at`, faded by the target forwards
        since then."""
        return m.weight * 0.5 ** ((self.n_forwards - at) / self.pricing.stale_half_life)

    def _draft_evidence(self, name: str) -> float:
        m = self.drafts.get(name)
        return 0.0 if m is None else self._evidence(m, self.drafted_at[name])

    def _profile_ms(self, s: int) -> float:
        assert self.profile.step_ms is not None
        return self.profile.step_ms * self.profile.cv(s)

    def ms(self, s: int) -> float:
        """The estimated ms of a target forward over `s` tokens now."""
        seen = {k: m.value for k, m in self.forwards.items()
                if self._evidence(m, self.forwarded_at[k]) >= self.min_weight}
        if s in seen:
            return seen[s]
        if not seen:
            return self._profile_ms(s)
        near = min(seen, key=lambda k: (abs(math.log(k / s)), k))
        return self._profile_ms(s) * seen[near] / self._profile_ms(near)

    def costs(self) -> Costs:
        """The profile's costs re-expressed at the machine's present speed."""
        p = self.profile
        stored = {s for s, _ in p.cv.points} or set(SIZES)
        sizes = sorted(s for s in stored | set(self.forwards) | {1} if p.cv.max_s is None or s <= p.cv.max_s)
        ms = {s: self.ms(s) for s in sizes}
        step = ms[1]                        # the smallest size: no narrower forward to raise it
        draft_cost = {}
        for name, rel in p.draft_cost.items():
            own = self.drafts[name].value if self._draft_evidence(name) >= self.min_weight else rel * p.step_ms
            draft_cost[name] = own / step
        return Costs(cv=CvCurve.measured(ms, source="calibrated").nondecreasing(), draft_cost=draft_cost,
                     round_overhead=p.round_overhead, step_ms=step)

    def due(self, rounds: int) -> bool:
        """Whether the controller gets re-calibrated costs after round number `rounds` (1, then every
        Pricing.recalibrate_every rounds)."""
        return (rounds - 1) % self.pricing.recalibrate_every == 0

    def in_step(self, lag: int) -> bool:
        """Whether a proposal after a catch-up of `lag` ids times the drafter's own step
        (Pricing.in_step_lag): a wider catch-up forward would price the step too dear."""
        return lag <= self.pricing.in_step_lag
