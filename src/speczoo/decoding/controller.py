"""The adaptive controller: per round, which drafter (or none) and how many draft tokens K.

It keeps a running estimate of each drafter's per-position acceptance α and picks the (drafter, K) with
the most expected tokens per unit of time under the cost model (decoding/cost.py):
    rate(drafter, K) = E(α, K) / (K·draft_cost + c_v(K+1) + round_overhead)     (plain decoding: 1.0)

Estimating α: in a round with K drafted tokens the accepted count a is a truncated geometric sample —
a successes, then one failure unless a = K — so the estimate is successes / trials with trials =
a + [a < K] (the maximum-likelihood estimate; accepted/drafted would be biased low). Both counts fade
exponentially per judged token, shrink towards a prior, and also fade while the drafter sits unused.
A change detector (CUSUM) drops the history when α collapses (a few zero-accept rounds after a good
stretch), and a probe that is very improbable under a low estimate replaces it, so a conversation that
stops being extractive switches drafting off within a few rounds, and one that turns extractive
switches it back on after one good probe. See AcceptanceEstimate.

It generalizes the hit-rate gate: a drafter whose estimate falls below break-even is not used, but a
drafter left unused for a while is tried again (a probe, with an optimistic K) when it could beat the
current choice at all (a probe that cannot win is pure cost). The costs are whatever the machine
measured (a cheap or a dear verify, a cheap or a dear draft step), so every decision prices them the
same way, and none bets on an α the evidence does not show:
  * a drafter is chosen at an optimistic α (the estimate plus `explore` standard errors, so that one
    judged on few tokens is tried again soon), and only when E(α, K) / (K·draft_cost + c_v(K+1) +
    overhead) > 1 there: the dearer a verify or a draft step, the higher the α this takes, so the
    costs themselves keep optimism in check;
  * the round is planned on what is known of α, never on the optimistic bound: K maximizes the tokens
    expected over the estimate's posterior (AcceptanceEstimate.expected_tokens, taken as worth at least
    PLAN_EVIDENCE tokens) per unit of the round's cost. Where no K pays on what is known (only optimism
    says it does: α unknown, or just fallen) the round is a test of one token, the cheapest evidence;
  * a probe that finds nothing wastes its round's cost less one step; probes of a drafter are spaced so
    that this waste stays within PROBE_BUDGET of a step per round (every `reprobe_every` rounds where a
    verify is cheap, rarer where it is dear; see `probe_period`).
An empty draft (an n-gram drafter with no candidate) is no evidence either way; the engine then asks for
the `alternative`, the best other drafter, in the same round.

Situations: a drafter may say, before it is chosen, how promising this round's proposal is (for prompt
lookup: how long the match is and whether its earlier occurrences agree on what comes next; see
Drafter.situation). The controller keeps one estimate per (drafter, situation), each starting from the
drafter's prior for that situation, so a long agreeing match is drafted deep while a one-token match
with conflicting continuations is left to the draft model or to plain decoding in the same text. A
drafter whose situation is None has nothing to propose this round and is not considered.

Confidence: a drafter that knows how sure it is of each token it proposes (a draft model) is asked for up
to k_max tokens with per-depth floors and stops itself once the chain is unlikely to survive (STOP_RATE);
its α is then judged on the first token of each draft. The engine re-prices the costs as it runs from
its own timings (decoding/calibrate.py) and hands them over with `use_costs`.

The classic gate — one drafter, fixed K, off after `gate_after` zero-accept rounds in a row, back on when
a probe gets anything accepted — is `Controller.gate(drafter, k, gate_after, reprobe_every)`.

Pure decision logic: never touches a model, a cache or a clock; measured costs come in as `Costs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from speczoo.decoding.cost import Costs, best_k, round_cost, speedup
from speczoo.decoding.runs import DEEP_RUN, RunLengths

NONE = "none"           # the choice "no drafter": a plain decode round
COLLAPSE = 0.1          # the alternative the change detector watches for: α dropping to a tenth
CEILING_ALPHA = 0.99    # "nearly every draft token accepted": the best a probed drafter could do
# A switch to a lagging draft model is charged its catch-up twice: the switch usually ends with prompt
# lookup taking over again, after which the draft lags again and pays again. Measured on the built-in
# extractive-QA prompt (tok/s of auto, two runs each): weight 1 → 77.2, 71.2; 2 → 79.0, 81.9; 3 → 78.8,
# 80.9 (prompt lookup alone ≈ 84); free-form: 1 → 35.8, 41.4; 2 → 39.7, 40.2; 3 → 36.2, 40.2.
CATCH_UP_WEIGHT = 2.0
# When plain decoding would win a round only because a lagging drafter must first catch up, that drafter
# is judged with its catch-up spread over the rounds it is then expected to keep the floor, at least
# SPREAD_ROUNDS: its lag only grows while it waits, so waiting makes the catch-up dearer, never cheaper,
# and a draft model that fell behind during a few prompt-lookup rounds was otherwise locked out (lag
# 10 → 23 in plain rounds until its next probe, on the built-in free-form prompt). Not where another
# drafter wins the round: there the lag is left to grow, and prompt lookup keeps a copied text. Chosen
# with `python -m speczoo.bench.auto_replay` over the built-in prompts and two suite questions per
# category at draft steps of 0.28 and 0.42 target steps: auto against the best single drafter, mean
# -1.9% → -1.4% and -1.1% → -0.8%, built-in free-form -5.1% → -1.7% and -5.9% → +1.1%; 4 rounds gave
# -1.3% and -0.7% but kept free-form at -2.8% at 0.42; 16 rounds made code completion -13%.
SPREAD_ROUNDS = 8.0
# A drafter that knows its own confidence (a draft model: the probability it gave each token it proposed)
# drafts up to k_max and stops once the product of its confidences falls below a floor: going on costs a
# draft step plus one more verify row, and pays only if the chain is still likely to be accepted. The
# floor after i tokens is STOP_RATE × (draft step + c_v(i + 2) − c_v(i + 1)), the round's marginal cost
# priced at a typical speculative rate. Chosen by replaying the built-in prompts offline (the 0.5B's
# teacher-forced confidences over the 1.5B's greedy output, under the costs of both host speeds seen on
# 2026-11-30): rates from 1.3 to 1.6 were best on every prompt, and on free-form writing floors beat the
# best fixed K by about 5%. `python -m speczoo.bench.draft_replay` repeats that replay on today's machine;
# `python -m speczoo.bench.drafters` measures the real thing.
STOP_RATE = 1.5
# A probe that finds nothing still emits one token, so it wastes its round's cost less one target step.
# A drafter's probes are spaced so that the waste stays within this share of a target step per round:
# every `reprobe_every` (16) rounds while a probe's waste is at most 16 × PROBE_BUDGET = 0.125 steps,
# rarer beyond. On the AVX-512 profile a 4-token prompt-lookup probe wastes 0.25 steps (one per 32
# rounds) and a 2-token draft-model probe 0.64 (one per 82); where c_v(3) = 2.1, a 2-token prompt-lookup
# probe wastes 1.12 (one per 143). How it was chosen: docs/tuning.md.
PROBE_BUDGET = 1.0 / 128
# PROBE_BUDGET for a drafter whose drafting is free (prompt lookup): it is probed only where it has a
# match, and text that copies the prompt comes in stretches that rarer probes miss where a verify is
# dear. How it was chosen: docs/tuning.md.
FREE_PROBE_BUDGET = 1.0 / 40
# K is planned on the tokens expected over the posterior of α, whose spread rewards a deeper K the less
# is known (E is convex in α). A prior alone is only `prior_weight` (2) tokens of evidence: at 0.95 that
# posterior puts most of its mass near 1 and would draft 8 deep where a verify of 9 costs 5 steps. The
# plan takes what is known as worth at least this many judged tokens. How it was chosen: docs/tuning.md.
PLAN_EVIDENCE = 8.0


@dataclass
class Choice:
    drafter: str            # a drafter name, or "none" for plain decoding
    k: int                  # draft tokens to ask for (0 with "none"); a cap when `floors` are given
    probe: bool = False     # a re-probe of a drafter the controller had stopped using
    floors: tuple[float, ...] = ()   # confidence floors (see Drafter.propose); () when not confident

    @property
    def drafting(self) -> bool:
        return self.drafter != NONE and self.k > 0


class AcceptanceEstimate:
    """Exponentially weighted α of one drafter from (drafted, accepted) per round, with change detection.

    Evidence fades per judged draft token (`half_life` tokens), so the estimate has about the same
    precision whatever α and K are; while the drafter sits out rounds it also fades per round
    (`idle_half_life`), down to `idle_floor` judged tokens, so a drafter written off on old evidence can
    be rehabilitated by a few probes. Two surprises replace the history with the recent evidence, because
    a long memory would otherwise take tens of rounds to notice that the text changed character:
    - a collapse: a CUSUM test of "α fell to COLLAPSE × the estimate" against "α is the estimate",
      over the judged tokens since the statistic last touched 0, exceeds log(1/reset_p) (the drafter
      stopped working: from α ≈ 0.9 four zero-accept rounds are enough to switch it off, and a stray
      accepted token does not restart the count; in steady use a false alarm comes about once in
      several hundred rounds);
    - a probe round with `accepted` tokens kept, when P(at least that many) = α^accepted < reset_p
      (a drafter that was off works again). Only probes count here: in the drafter's normal use long
      accepted runs are expected and must not inflate the estimate.
    """

    def __init__(self, half_life: float = 32.0, prior_alpha: float = 0.5, prior_weight: float = 2.0,
                 reset_p: float = 1e-3, idle_half_life: float = 16.0, idle_floor: float = 8.0,
                 collapses: bool = True):
        if half_life <= 0 or idle_half_life <= 0:
            raise ValueError(f"half lives must be > 0, got {half_life} tokens and {idle_half_life} rounds")
        if idle_floor < 0:
            raise ValueError(f"idle_floor must be >= 0 judged tokens, got {idle_floor}")
        if not 0.0 < prior_alpha < 1.0:
            raise ValueError(f"prior_alpha must be in (0, 1), got {prior_alpha}")
        if prior_weight <= 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
        if not 0.0 < reset_p < 1.0:
            raise ValueError(f"reset_p must be in (0, 1), got {reset_p}")
        self.decay = 0.5 ** (1.0 / half_life)              # per judged draft token
        self.idle_decay = 0.5 ** (1.0 / idle_half_life)    # per round the drafter sits out
        self.idle_floor = idle_floor
        self.prior_alpha, self.prior_weight, self.reset_p = prior_alpha, prior_weight, reset_p
        self.collapses = collapses  # False: no collapse test (an α that drifts rather than falls off a cliff)
        self.successes = 0.0
        self.trials = 0.0
        self.zero_streak = 0        # rounds in a row with drafted > 0 and nothing accepted
        self.resets = 0
        self._cusum = 0.0           # CUSUM statistic for "α collapsed to COLLAPSE × its estimate"
        self._run_alpha = prior_alpha       # the estimate when the current CUSUM run began
        self._run_s = 0.0           # evidence gathered since then
        self._run_t = 0.0

    @property
    def alpha(self) -> float:
        w = self.prior_weight
        return (self.successes + self.prior_alpha * w) / (self.trials + w)

    def upper(self, z: float) -> float:
        """An optimistic α: the estimate plus z standard errors (wide on little evidence, so a drafter
        that failed once early is tried again soon; tight once it has been judged on many tokens)."""
        a = self.alpha
        return min(CEILING_ALPHA, a + z * math.sqrt(a * (1.0 - a) / (self.trials + self.prior_weight)))

    def expected_tokens(self, k: int, least: float = 0.0) -> float:
        """E(α, K) averaged over what is known of α: the posterior Beta(a, b) of the (faded) evidence
        and the prior, whose moments are E[α^i] = Π_{j<i} (a + j) / (a + b + j). At least E at the
        estimate (E is convex in α), the more so the less is known. least: the posterior is taken as
        worth at least this many judged tokens (same mean), which caps what uncertainty alone adds."""
        a = self.successes + self.prior_alpha * self.prior_weight
        n = self.trials + self.prior_weight
        if n < least:
            a, n = a * least / n, least
        total = moment = 1.0
        for j in range(k):
            moment *= (a + j) / (n + j)
            total += moment
        return total

    def idle(self) -> None:
        """The drafter sat out a round: its evidence grows stale, down to `idle_floor` judged tokens."""
        if self.trials > self.idle_floor:
            f = max(self.idle_decay, self.idle_floor / self.trials)
            self.successes *= f
            self.trials *= f

    def update(self, drafted: int, accepted: int, probe: bool = False) -> None:
        if drafted == 0:
            return                              # no candidate this round: no evidence
        miss = 1 if accepted < drafted else 0
        before = self.alpha
        self.zero_streak = self.zero_streak + 1 if accepted == 0 else 0
        if self._cusum == 0.0:                  # a new run starts: judge it against today's estimate
            self._run_alpha, self._run_s, self._run_t = before, 0.0, 0.0
        a0 = min(max(self._run_alpha, 1e-6), 1 - 1e-6)
        a1 = a0 * COLLAPSE
        llr = accepted * math.log(a1 / a0) + miss * math.log((1 - a1) / (1 - a0))
        self._cusum = max(0.0, self._cusum + llr)
        self._run_s += accepted
        self._run_t += accepted + miss
        if self.collapses and self._cusum > -math.log(self.reset_p):
            self._replace(self._run_s, self._run_t)
        elif probe and accepted and accepted * math.log(max(before, 1e-300)) < math.log(self.reset_p):
            self._replace(float(accepted), float(accepted + miss))
        else:
            fade = self.decay ** (accepted + miss)
            self.successes = fade * self.successes + accepted
            self.trials = fade * self.trials + accepted + miss

    def _replace(self, successes: float, trials: float) -> None:
        """Change detected: forget what came before; the surprising run is the evidence."""
        self.successes, self.trials = successes, trials
        self._cusum = 0.0
        self.resets += 1


class Controller:
    """Chooses (drafter, K) per round to maximize expected tokens per unit time.

    costs:          measured costs; None only for a fixed-K single-drafter gate (no cost model).
    drafters:       the drafters available this generation ("none" is always available).
    k_max:          the most draft tokens per round.
    fixed_k:        always this K when drafting (no K optimization).
    gate_after:     switch a drafter off after this many zero-accept rounds in a row, whatever the
                    cost model says; a probe with anything accepted switches it back on.
    reprobe_every:  a drafter not chosen for this many rounds is probed once (an empty probe draft
                    waits for the next period); longer where probes are dear (see `probe_period`).
    probe_alpha:    the optimistic α that sets a probe's K (its estimate, if higher, wins).
    probe_budget:   the share of a target step per round a drafter's probes may waste (PROBE_BUDGET).
    free_probe_budget: the same for a drafter that drafts for free (FREE_PROBE_BUDGET).
    explore:        drafters are chosen at α + explore standard errors of each estimate (optimism in
                    the face of uncertainty: a drafter judged on few tokens gets the benefit of the
                    doubt; 0 = choose on the point estimates); K is planned on what is known.
    half_life, prior_alpha, prior_weight, reset_p: see AcceptanceEstimate.
    catch_up_weight: how many times a round charges a lagging drafter's catch-up (CATCH_UP_WEIGHT).
    runs:           the running mean of each drafter's runs of rounds (decoding/runs.py), which lets a
                    confident drafter that keeps the floor draft deep (see `_finish`).
    priors:         per drafter, situation -> prior α of that situation's estimate (prior_alpha otherwise).
    confident:      drafters that stop on their own confidence: when chosen they get the floors of
                    `floors` (see STOP_RATE) and, if alone, up to k_max tokens; their α is estimated
                    from the first token of each draft only, without the collapse test: a draft
                    model's first-token acceptance drifts with the text, and its streaks of misses in
                    free-form text (three in a row after an easy stretch) are not the cliff prompt
                    lookup falls off when the text stops copying.
    stop_rate:      the rate that prices the confidence floors (STOP_RATE).
    """

    def __init__(self, costs: Costs | None, drafters: list[str], k_max: int = 8, *,
                 fixed_k: int | None = None, gate_after: int | None = None, reprobe_every: int = 16,
                 probe_alpha: float = 0.8, probe_budget: float = PROBE_BUDGET,
                 free_probe_budget: float = FREE_PROBE_BUDGET, explore: float = 0.5,
                 half_life: float = 32.0,
                 prior_alpha: float = 0.5, prior_weight: float = 2.0, reset_p: float = 1e-3,
                 priors: dict[str, dict[str, float]] | None = None, catch_up_weight: float = CATCH_UP_WEIGHT,
                 confident: frozenset[str] | set[str] = frozenset(), stop_rate: float = STOP_RATE,
                 runs: RunLengths | None = None):
        names = [d for d in drafters if d != NONE]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique, got {drafters}")
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        if fixed_k is not None and not 1 <= fixed_k <= k_max:
            raise ValueError(f"fixed_k must be in 1..k_max={k_max}, got {fixed_k}")
        if gate_after is not None and gate_after < 1:
            raise ValueError(f"gate_after must be >= 1 round, got {gate_after}")
        if reprobe_every < 1:
            raise ValueError(f"reprobe_every must be >= 1 round, got {reprobe_every}")
        for name, value in (("probe_budget", probe_budget), ("free_probe_budget", free_probe_budget)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 target steps per round, got {value}")
        if costs is None and (len(names) > 1 or fixed_k is None):
            raise ValueError("without Costs the controller can only gate one drafter at a fixed K; "
                             "pass Costs(cv=..., draft_cost={...}) to choose among drafters or K")
        if costs is not None:
            missing = [d for d in names if d not in costs.draft_cost]
            if missing:
                raise ValueError(f"Costs.draft_cost has no entry for {missing}; give each drafter its "
                                 f"cost per proposed token (0.0 for n-gram lookup)")
        self.costs = costs
        self.drafters = names
        self.k_max, self.fixed_k, self.gate_after = k_max, fixed_k, gate_after
        self.reprobe_every, self.probe_alpha, self.probe_budget = reprobe_every, probe_alpha, probe_budget
        self.free_probe_budget = free_probe_budget
        if explore < 0:
            raise ValueError(f"explore must be >= 0 standard errors, got {explore}")
        self.explore = explore
        if not catch_up_weight >= 1.0:
            raise ValueError(f"catch_up_weight must be >= 1, got {catch_up_weight}")
        self.catch_up_weight = catch_up_weight
        self.runs = runs or RunLengths(names)
        if set(self.runs.mean) != set(names):
            raise ValueError(f"the run lengths track {sorted(self.runs.mean)}, not the drafters {names}")
        unknown = set(confident) - set(names)
        if unknown:
            raise ValueError(f"confident drafters {sorted(unknown)} are not among the drafters {names}")
        self.confident = frozenset(confident)
        if not stop_rate >= 0:
            raise ValueError(f"stop_rate must be >= 0, got {stop_rate}")
        self.stop_rate = stop_rate
        self._estimate_args = (half_life, prior_alpha, prior_weight, reset_p)
        self.priors = {d: dict((priors or {}).get(d, {})) for d in names}
        bad = {(d, k): a for d, table in self.priors.items() for k, a in table.items() if not 0.0 < a < 1.0}
        if bad:
            raise ValueError(f"situation priors must be in (0, 1), got {bad}")
        self.estimates: dict[tuple[str, str], AcceptanceEstimate] = {}   # (drafter, situation) -> estimate
        self.situations: dict[str, str | None] = {}   # this round's situation per drafter (absent: "")
        self._probing = ""          # the drafter probed by the last choose(), if any
        self._last = ""             # the drafter the last round ended up with (NONE: plain), for `runs`
        self.round = 0
        # The round each drafter was last chosen; "long ago" at the start, so a drafter the cost model
        # would not pick on its prior alone is probed in the first rounds where probes are cheap, rather
        # than after a period (where they are dear, after its probe period less reprobe_every rounds).
        self.last_chosen = {d: -reprobe_every for d in names}

    @classmethod
    def gate(cls, drafter: str, k: int, gate_after: int = 3, reprobe_every: int = 16) -> Controller:
        """The hit-rate gate: `drafter` at fixed K, off after `gate_after` zero-accept rounds in a row,
        probed every `reprobe_every` rounds while off, back on when a probe gets anything accepted."""
        return cls(None, [drafter], k_max=k, fixed_k=k, gate_after=gate_after,
                   reprobe_every=reprobe_every)

    def use_costs(self, costs: Costs) -> None:
        """Decide with `costs` from now on (re-calibrated ones: the same drafters at today's prices)."""
        if self.costs is None:
            raise ValueError("a gate without a cost model cannot take costs")
        missing = [d for d in self.drafters if d not in costs.draft_cost]
        if missing:
            raise ValueError(f"the new costs do not price the drafters {missing}")
        self.costs = costs

    def alpha(self, drafter: str, situation: str | None = None) -> float:
        """The α estimate of `drafter` in `situation` (default: its situation this round)."""
        return self._estimate(drafter, situation).alpha

    def gated(self, drafter: str) -> bool:
        return self.gate_after is not None and self._estimate(drafter).zero_streak >= self.gate_after

    def available(self, drafter: str) -> bool:
        """Whether `drafter` has something to propose this round (its situation is not None)."""
        return self.situations.get(drafter, "") is not None

    def rate(self, drafter: str, k: int, alpha: float | None = None, lag: int = 0, spread: bool = False
             ) -> float:
        """Expected tokens per target step of a round with `drafter` and K (1.0 for plain decoding);
        lag: ids the drafter must first catch up on (see `catch_up`); spread: that catch-up spread over
        the rounds the drafter is expected to keep the floor (see SPREAD_ROUNDS)."""
        if drafter == NONE or k == 0:
            return 1.0
        if self.costs is None:
            raise ValueError("this controller has no Costs; rates need a cost model")
        a = self.alpha(drafter) if alpha is None else alpha
        return speedup(a, k, self.costs.cv, self.costs.draft_cost[drafter], self._overhead(drafter, lag, spread))

    def catch_up(self, drafter: str, lag: int) -> float:
        """The cost, in target steps, of a drafter first feeding `lag` ids it has not seen (a draft model
        that sat out rounds): its step cost times the extra width of that first forward, taking the
        target's c_v curve as the shape of the draft's (both are decoders on the same kernels)."""
        if lag <= 0 or self.costs is None:
            return 0.0
        # never below nothing: a profile timed on a busy machine can put c_v(S) under 1
        return self.costs.draft_cost[drafter] * max(0.0, self.costs.cv.wide(lag + 1) - 1.0)

    def stops_on_confidence(self, drafter: str) -> bool:
        """Whether `drafter` is asked for up to k_max tokens with confidence floors when chosen."""
        return drafter in self.confident and self.costs is not None and self.fixed_k is None

    def floors(self, drafter: str, k: int) -> tuple[float, ...]:
        """Confidence floors of a `k`-token draft by `drafter`: floors[i - 1] is what the product of its
        first i token confidences must reach for it to draft token i + 1 (see STOP_RATE); () for a
        drafter that does not stop on its confidence."""
        if not self.stops_on_confidence(drafter):
            return ()
        assert self.costs is not None
        cv, step = self.costs.cv, self.costs.draft_cost[drafter]
        return tuple(self.stop_rate * (step + cv(i + 2) - cv(i + 1)) for i in range(1, k))

    def _finish(self, choice: Choice) -> Choice:
        """A chosen drafter that stops on its own confidence gets its floors; when it is the only drafter,
        or when it keeps the floor for runs of DEEP_RUN rounds or more (decoding/runs.py), it may also draft
        up to k_max tokens (as far as the c_v curve reaches). Otherwise its K stays the plan's: a long
        chain would preempt the other drafters, and prompt lookup that has no match this round often
        resumes a copy the next, at a fraction of the cost per token (verbatim reproduction under `auto`
        lost 3-9% to one 8-token draft-model chain at the start)."""
        if not self.stops_on_confidence(choice.drafter):
            return choice
        assert self.costs is not None
        k = choice.k
        if len(self.drafters) == 1 or self.runs.expected(choice.drafter) >= DEEP_RUN:
            top = self.costs.cv.max_s
            k = max(k, self.k_max if top is None else min(self.k_max, top - 1))
        return replace(choice, k=k, floors=self.floors(choice.drafter, k))

    def _overhead(self, drafter: str, lag: int, spread: bool = False) -> float:
        assert self.costs is not None
        rounds = max(SPREAD_ROUNDS, self.runs.expected(drafter)) if spread else 1.0
        return self.costs.round_overhead + self.catch_up_weight * self.catch_up(drafter, lag) / rounds

    def plan(self, drafter: str, alpha: float | None = None, lag: int = 0, spread: bool = False) -> Choice:
        """The best K for `drafter` at its estimate (or at `alpha`), ignoring gates and probes; lag and
        spread as for `rate`."""
        if self.fixed_k is not None:
            return Choice(drafter, self.fixed_k)
        assert self.costs is not None
        a = self.alpha(drafter) if alpha is None else alpha
        b = best_k(a, self.costs.cv, self.costs.draft_cost[drafter], self.k_max,
                   self._overhead(drafter, lag, spread))
        return Choice(drafter, b.k)

    def decide(self, exclude: str = "", lags: dict[str, int] | None = None) -> Choice:
        """The best (drafter, K) on the current estimates (leaving out `exclude`), without probes and
        without side effects; lags as for `choose`."""
        return self._best(exclude, lags or {})[0]

    def _best(self, exclude: str, lags: dict[str, int]) -> tuple[Choice, float]:
        """This round's plan and the rate it was chosen at (see `_best_at`); if that is plain decoding,
        the best again with each lagging drafter's catch-up spread (SPREAD_ROUNDS)."""
        best = self._best_at(exclude, lags, spread=False)
        if best[0].drafter == NONE and any(lags.get(d, 0) > 0 for d in self.drafters):
            best = self._best_at(exclude, lags, spread=True)
        return best

    def _best_at(self, exclude: str, lags: dict[str, int], spread: bool) -> tuple[Choice, float]:
        """The drafter with the best rate at its optimistic α (see `explore`), if that beats plain
        decoding, with its rate there. Its round is planned on what is known of its α (`_plan_known`)
        where that pays; where only optimism says it pays, the round is a test and drafts one token,
        except with a catch-up spread over the coming rounds (`spread`): a bet on those rounds is made
        on what is known, never as a test: a test's one token cannot repay a catch-up (docs/tuning.md)."""
        best, best_rate = Choice(NONE, 0), 1.0
        for d in self.drafters:
            if d == exclude or not self.available(d) or self.gated(d):
                continue
            if self.costs is None:                  # a gate: on until gated, at its fixed K
                return self.plan(d), math.inf
            est, lag = self._estimate(d), lags.get(d, 0)
            a = est.upper(self.explore)
            r = self.rate(d, self.plan(d, a, lag, spread).k, a, lag, spread)
            if r > best_rate:
                c, known = self._plan_known(d, lag, spread)
                if known <= 1.0:
                    if spread:                      # a catch-up spread is a bet on coming rounds
                        continue
                    c = Choice(d, 1)                # it loses on what is known: the cheapest test
                best, best_rate = c, r
        return best, best_rate

    def _plan_known(self, drafter: str, lag: int, spread: bool) -> tuple[Choice, float]:
        """The K with the most tokens expected over what is known of the drafter's α per unit of its
        round's cost, and that rate (ties: the smaller K)."""
        assert self.costs is not None
        est, c = self._estimate(drafter), self.costs
        overhead = self._overhead(drafter, lag, spread)
        ks = [self.fixed_k] if self.fixed_k is not None else range(1, self.k_max + 1)
        best_k, best = 0, 0.0
        for k in ks:
            r = est.expected_tokens(k, PLAN_EVIDENCE) / round_cost(k, c.cv, c.draft_cost[drafter], overhead)
            if r > best * (1 + 1e-12):
                best_k, best = k, r
        return Choice(drafter, best_k), best

    def probe_period(self, drafter: str) -> float:
        """Rounds between probes of `drafter` while it sits unused: `reprobe_every`, or more where a
        probe that finds nothing (one token for its round's cost) would waste more than `probe_budget`
        (`free_probe_budget` for a drafter that drafts for free) target steps per round. The catch-up of
        a lagging drafter is left to `could_beat`."""
        if self.costs is None:
            return float(self.reprobe_every)
        k = self.plan(drafter, max(self.alpha(drafter), self.probe_alpha)).k
        waste = round_cost(k, self.costs.cv, self.costs.draft_cost[drafter], self.costs.round_overhead) - 1.0
        budget = self.free_probe_budget if self.costs.draft_cost[drafter] == 0.0 else self.probe_budget
        return max(float(self.reprobe_every), waste / budget)

    def could_beat(self, drafter: str, rate: float, lag: int = 0) -> bool:
        """Whether `drafter` could beat `rate` at all: its best rate if nearly every token were accepted.
        A probe that cannot win is not worth its cost (a draft model that must first catch up on the
        text since it last ran, a verify over K + 1 tokens)."""
        if self.costs is None:
            return True
        return self.rate(drafter, self.plan(drafter, CEILING_ALPHA, lag).k, CEILING_ALPHA, lag) > rate

    def alternative(self, exclude: str, lags: dict[str, int] | None = None) -> Choice:
        """This round's fallback when `exclude` (just chosen) had nothing to propose: the best of the
        other drafters on their estimates, or plain decoding. No probe; `update` then concerns it.
        lags: as for `choose`."""
        best = self.decide(exclude, lags)
        if best.drafter != NONE:
            self.last_chosen[best.drafter] = self.round
        self._probing = ""
        self._last = best.drafter
        return self._finish(best)

    def choose(self, lags: dict[str, int] | None = None, situations: dict[str, str | None] | None = None
               ) -> Choice:
        """This round's drafter and K; call once per round, then `update` with what happened.

        lags: per drafter, the ids it must feed before it can propose (Drafter.lag); their catch-up
        cost counts against that drafter this round.
        situations: per drafter, its Drafter.situation this round (None: nothing to propose; a drafter
        not named is in its one default situation "")."""
        self.round += 1
        if self._last:
            self.runs.round(self._last)
        lags = lags or {}
        self.situations = dict(situations or {})
        best, best_rate = self._best("", lags)
        stale = [d for d in self.drafters
                 if d != best.drafter and self.available(d)
                 and self.round - self.last_chosen[d] >= self.probe_period(d)
                 and self.could_beat(d, best_rate, lags.get(d, 0))]
        if stale:
            d = min(stale, key=lambda name: self.last_chosen[name])
            best = Choice(d, self.plan(d, max(self.alpha(d), self.probe_alpha), lags.get(d, 0)).k, probe=True)
        if best.drafter != NONE:
            self.last_chosen[best.drafter] = self.round
        for (d, _), est in self.estimates.items():
            if d != best.drafter:
                est.idle()
        self._probing = best.drafter if best.probe else ""
        self._last = best.drafter
        return self._finish(best)

    def update(self, drafter: str, drafted: int, accepted: int) -> None:
        """After a round: `drafted` tokens proposed (0: the drafter had no candidate), `accepted` kept."""
        if drafter == NONE:
            return
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        if drafted and self.stops_on_confidence(drafter):
            # It drafted past its first token only when sure of the chain, so the later tokens are a
            # chosen few; the first, drafted every round, is the unbiased sample of its α.
            drafted, accepted = 1, min(accepted, 1)
        self._estimate(drafter).update(drafted, accepted, probe=drafter == self._probing)
        self._probing = ""

    def _estimate(self, drafter: str, situation: str | None = None) -> AcceptanceEstimate:
        """The estimate of `drafter` in `situation` (default: this round's), made on first use."""
        if drafter not in self.priors:
            raise ValueError(f"unknown drafter {drafter!r}; this controller knows {self.drafters}")
        key = (drafter, (self.situations.get(drafter) or "") if situation is None else situation)
        est = self.estimates.get(key)
        if est is None:
            half_life, prior_alpha, prior_weight, reset_p = self._estimate_args
            prior = self.priors[drafter].get(key[1], prior_alpha)
            est = self.estimates[key] = AcceptanceEstimate(half_life, prior, prior_weight, reset_p,
                                                           collapses=drafter not in self.confident)
        return est
