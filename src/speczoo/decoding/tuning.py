"""The controller's tuning: every constant that shapes its choices, in one frozen value passed whole.

Each field says what it sets and why; how its value was measured, and what it bought on the offline
replay (`python -m benchmarks.auto_replay --replay F --profile cheap-verify,dear-verify,dear-draft`),
is docs/tuning.md, one row per field. Costs are not tuning: they are measured per machine (Costs,
decoding/controller.py). A plain value: never reads a model, a cache or a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Tuning:
    """What the controller (decoding/controller.py) decides with, besides the measured costs.

    Choosing a drafter:
    explore:        drafters are chosen at α + explore standard errors of each estimate, so one judged
                    on few tokens gets the benefit of the doubt; K is planned on what is known.
    ceiling_alpha:  "nearly every draft token accepted": caps the optimistic α, and is the α at which a
                    probe is asked whether it could win at all (a probe that cannot is pure cost).
    The acceptance estimates (decoding/acceptance.py):
    half_life:      judged draft tokens after which evidence counts half.
    prior_alpha:    α before any evidence, where a drafter gives no prior for its situation.
    prior_weight:   how many judged tokens a prior is worth.
    plan_evidence:  K is planned on the tokens expected over the posterior of α, whose spread rewards a
                    deeper K the less is known (E is convex in α); the plan takes what is known as worth
                    at least this many judged tokens, so a prior alone does not buy an 8-deep draft.
    Probes of a drafter the controller stopped using:
    reprobe_every:  the fewest rounds between two probes of one drafter.
    probe_alpha:    the α that sets a probe's K (the drafter's estimate, if higher, wins).
    probe_budget:   a probe that finds nothing wastes its round's cost less one target step; probes are
                    spaced so that this waste stays within this share of a target step per round.
    free_probe_budget: the same for a drafter whose drafting is free (prompt lookup): it is probed only
                    where it has a match, and text that copies the prompt comes in stretches that rarer
                    probes miss where a verify is dear.
    A drafter that must first catch up (a draft model that sat out rounds):
    catch_up_weight: how many times a round charges that catch-up: a switch to a lagging draft model
                    usually ends with prompt lookup taking over again, after which it lags and pays again.
    spread_rounds:  where plain decoding would win a round only because of a catch-up, the catch-up is
                    spread over the rounds the drafter is then expected to keep the floor, at least these:
                    its lag only grows while it waits, so waiting makes the catch-up dearer, never cheaper.
    A drafter that knows its confidence (a draft model):
    stop_rate:      it drafts up to K and stops once the product of its confidences falls below a floor;
                    the floor after i tokens is stop_rate × (draft step + c_v(i + 2) − c_v(i + 1)), the
                    round's marginal cost priced at a typical speculative rate.
    deep_run:       when its runs of rounds (decoding/runs.py) are this long on their running mean, it
                    may draft up to k_max: then prompt lookup rarely takes a round from it, so a long
                    chain preempts nothing.
    run_prior:      the run length expected before any run has ended (below deep_run: no deep chains
                    until a drafter has shown a run of several rounds).
    run_weight:     the weight of the latest run in that running mean (runs change with the text).
    """

    explore: float = 0.5
    ceiling_alpha: float = 0.99
    half_life: float = 32.0
    prior_alpha: float = 0.5
    prior_weight: float = 2.0
    plan_evidence: float = 8.0
    reprobe_every: int = 16
    probe_alpha: float = 0.8
    probe_budget: float = 1.0 / 128
    free_probe_budget: float = 1.0 / 40
    catch_up_weight: float = 2.0
    spread_rounds: float = 8.0
    stop_rate: float = 1.5
    deep_run: float = 2.0
    run_prior: float = 0.5
    run_weight: float = 0.5

    def __post_init__(self) -> None:
        bad = []
        for name in ("explore", "plan_evidence", "stop_rate"):
            if not getattr(self, name) >= 0:
                bad.append(f"{name} must be >= 0")
        for name in ("half_life", "prior_weight", "probe_budget", "free_probe_budget", "spread_rounds",
                     "deep_run", "run_prior"):
            if not getattr(self, name) > 0:
                bad.append(f"{name} must be > 0")
        for name in ("ceiling_alpha", "prior_alpha", "probe_alpha"):
            if not 0.0 <= getattr(self, name) < 1.0:
                bad.append(f"{name} must be in [0, 1)")
        if not 0.0 < self.prior_alpha:
            bad.append("prior_alpha must be > 0")
        if not 0.0 < self.run_weight <= 1.0:
            bad.append("run_weight must be in (0, 1]")
        if self.reprobe_every < 1:
            bad.append("reprobe_every must be >= 1 round")
        if not self.catch_up_weight >= 1.0:
            bad.append("catch_up_weight must be >= 1")
        bad += [f"{n} must be finite" for n, v in vars(self).items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"bad controller tuning: {'; '.join(bad)} (got {self})")
