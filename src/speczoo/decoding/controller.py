"""The adaptive controller: per round, which drafter (or none) and how many draft tokens K.

It keeps a running estimate of each drafter's per-position acceptance α (decoding/acceptance.py) and
picks the (drafter, K) with the most expected tokens per unit of time under the cost model
(decoding/pricing/cost.py):
    rate(drafter, K) = E(α, K) / (K·draft_cost + c_v(K+1) + round_overhead)     (plain decoding: 1.0)
The costs are whatever the machine measured (a cheap or a dear verify, a cheap or a dear draft step),
so every decision prices them the same way, and none bets on an α the evidence does not show:
  * a drafter is chosen at an optimistic α (the estimate plus `explore` standard errors, so that one
    judged on few tokens is tried again soon), and only when its rate there beats plain decoding: the
    dearer a verify or a draft step, the higher the α this takes, so the costs keep optimism in check;
  * the round is planned on what is known of α, never on the optimistic bound: K maximizes the tokens
    expected over the estimate's posterior (taken as worth at least `plan_evidence` judged tokens) per
    unit of the round's cost;
  * a drafter left unused for a while is tried again (a probe, at a K planned for `probe_alpha`) when
    it could beat the current choice at all; a probe that finds nothing wastes its round's cost less one
    step, so probes of a drafter are spaced to keep that waste within `probe_budget` of a step per round
    (every `reprobe_every` rounds where a verify is cheap, rarer where it is dear; see `probe_period`).

Situations: a drafter may say, before it is chosen, how promising this round's proposal is (for prompt
lookup: how long the match is and whether its earlier occurrences agree on what comes next; see
Drafter.situation). The controller keeps one estimate per (drafter, situation), each starting from the
drafter's prior for that situation, so a long agreeing match is drafted deep while a one-token match
with conflicting continuations is left to the draft model or to plain decoding in the same text. A
drafter whose situation is None has nothing to propose this round and is not considered.

Trees: a drafter that proposes token trees (Drafter.drafts_trees: prompt lookup's ngram-tree) is priced by
what its own trees got accepted, not by a chain's α: a round of an N-node tree is worth (a(N) + 1) /
(N·draft_cost + c_v(N + 1) + round_overhead), where a(N) is the mean accepted tokens of its trees cut to N
nodes in this situation (decoding/tree_acceptance.py). It competes with the chains as one more drafter:
chosen at an optimistic a(N), planned on the estimate, probed like the others. Where its branches catch
what a chain misses (keys and values of repeated records) it wins the round; where a chain's extra depth
is worth more than the branches, or c_v grows too fast with the rows, the chain or plain decoding does.

Catch-up: a drafter that sat out rounds (a draft model) must first feed the ids it missed; that cost
counts against it (`catch_up`), spread over the rounds it is expected to keep the floor where that
alone would lose the round (`spread_rounds`).

Confidence: a drafter that knows how sure it is of each token it proposes (a draft model) is asked for
up to K tokens with per-depth floors and stops itself once the chain is unlikely to survive
(`stop_rate`), its confidences read through their fit to what the target kept (decoding/confidence.py:
a draft surer or less sure than it is right stops where the chain's real chance says), up to k_max. Drafting
so, it yields more per round than a chain of its α would (deep where it is sure, short where it is not):
it is also priced by what its own rounds yielded, tokens per round over their cost (decoding/round_yield.py),
and chosen on the better of that and its α's rate. The
engine re-prices the costs as it runs from its own timings (decoding/pricing/calibrate.py) and hands them over
with `use_costs`.

Every constant lives in one Tuning (decoding/tuning.py); how each was measured: docs/tuning.md.
Pure decision logic: never touches a model, a cache or a clock; measured costs come in as `Costs`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from speczoo.decoding.acceptance import AcceptanceEstimate
from speczoo.decoding.confidence import ConfidenceFit
from speczoo.decoding.pricing.cost import Costs, best_k, round_cost, speedup
from speczoo.decoding.round_yield import RoundYield
from speczoo.decoding.runs import RunLengths
from speczoo.decoding.tree_acceptance import TreeAcceptance
from speczoo.decoding.tuning import Tuning

NONE = "none"           # the choice "no drafter": a plain decode round


@dataclass
class Choice:
    drafter: str            # a drafter name, or "none" for plain decoding
    k: int                  # draft tokens to ask for (0 with "none"); a cap when `floors` are given
    probe: bool = False     # a re-probe of a drafter the controller had stopped using
    floors: tuple[float, ...] = ()   # confidence floors (see Drafter.propose); () when not confident

    @property
    def drafting(self) -> bool:
        return self.drafter != NONE and self.k > 0


class Controller:
    """Chooses (drafter, K) per round to maximize expected tokens per unit time.

    costs:      measured costs; they must price every drafter.
    drafters:   the drafters available this generation ("none" is always available).
    k_max:      the most draft tokens per round.
    priors:     per drafter, situation -> prior α of that situation's estimate (Tuning.prior_alpha
                otherwise).
    confident:  drafters that stop on their own confidence: when chosen they get the floors of `floors`
                and up to k_max tokens.
    trees:      drafters that propose token trees of up to K nodes: priced by their own accepted tokens
                per node budget (TreeAcceptance), not by a chain's α; `update` needs their rounds' nodes
                and accepted paths.
    tuning:     every constant of the decisions (decoding/tuning.py).
    """

    def __init__(self, costs: Costs, drafters: list[str], k_max: int = 8, *,
                 priors: dict[str, dict[str, float]] | None = None,
                 confident: frozenset[str] | set[str] = frozenset(), trees: frozenset[str] | set[str] = frozenset(),
                 tuning: Tuning = Tuning()):
        names = [d for d in drafters if d != NONE]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique, got {drafters}")
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self._check_prices(costs, names)
        self.costs = costs
        self.drafters = names
        self.k_max = k_max
        self.tuning = tuning
        self.runs = RunLengths(names, tuning.run_prior, tuning.run_weight)
        unknown = set(confident) - set(names)
        if unknown:
            raise ValueError(f"confident drafters {sorted(unknown)} are not among the drafters {names}")
        self.confident = frozenset(confident)
        self.yields = {d: RoundYield(tuning.yield_weight, tuning.yield_rounds) for d in self.confident}
        self.fits = {d: ConfidenceFit(tuning.confidence_half_life, tuning.confidence_prior) for d in self.confident}
        unknown = set(trees) - set(names)
        if unknown:
            raise ValueError(f"tree drafters {sorted(unknown)} are not among the drafters {names}")
        if set(trees) & self.confident:
            raise ValueError(f"drafters {sorted(set(trees) & self.confident)} cannot both draft trees and "
                             f"stop on their confidence: a tree ranks its nodes instead")
        self.trees = frozenset(trees)
        self.priors = {d: dict((priors or {}).get(d, {})) for d in names}
        bad = {(d, k): a for d, table in self.priors.items() for k, a in table.items() if not 0.0 < a < 1.0}
        if bad:
            raise ValueError(f"situation priors must be in (0, 1), got {bad}")
        self.estimates: dict[tuple[str, str], AcceptanceEstimate] = {}   # (drafter, situation) -> estimate
        self.tree_estimates: dict[tuple[str, str], TreeAcceptance] = {}  # the same, of a tree drafter's a(N)
        self.situations: dict[str, str | None] = {}   # this round's situation per drafter (absent: "")
        self._last = ""             # the drafter the last round ended up with (NONE: plain), for `runs`
        self.round = 0
        self.last_chosen = {d: 0 for d in names}      # the round each drafter was last chosen

    @staticmethod
    def _check_prices(costs: Costs, names: list[str]) -> None:
        missing = [d for d in names if d not in costs.draft_cost]
        if missing:
            raise ValueError(f"Costs.draft_cost has no entry for {missing}; give each drafter its "
                             f"cost per proposed token (0.0 for n-gram lookup)")

    def use_costs(self, costs: Costs) -> None:
        """Decide with `costs` from now on (re-calibrated ones: the same drafters at today's prices)."""
        self._check_prices(costs, self.drafters)
        self.costs = costs

    def alpha(self, drafter: str, situation: str | None = None) -> float:
        """The α estimate of `drafter` in `situation` (default: its situation this round)."""
        return self._estimate(drafter, situation).alpha

    def available(self, drafter: str) -> bool:
        """Whether `drafter` has something to propose this round (its situation is not None)."""
        return self.situations.get(drafter, "") is not None

    def rate(self, drafter: str, k: int, alpha: float | None = None, lag: int = 0, spread: bool = False
             ) -> float:
        """Expected tokens per target step of a round with `drafter` and K (1.0 for plain decoding);
        lag: ids the drafter must first catch up on (see `catch_up`); spread: that catch-up spread over
        the rounds the drafter is expected to keep the floor (see Tuning.spread_rounds)."""
        if drafter == NONE or k == 0:
            return 1.0
        overhead = self._overhead(drafter, lag, spread)
        if alpha is None and drafter in self.trees:
            return self._tree(drafter).expected_tokens(k) / self._cost(drafter, k, overhead)
        a = self.alpha(drafter) if alpha is None else alpha
        return speedup(a, k, self.costs.cv, self.costs.draft_cost[drafter], overhead)

    def _cost(self, drafter: str, k: int, overhead: float) -> float:
        """A round's cost with K draft tokens (a chain's K, or a tree's K nodes: K + 1 verify rows)."""
        return round_cost(k, self.costs.cv, self.costs.draft_cost[drafter], overhead)

    def catch_up(self, drafter: str, lag: int) -> float:
        """The cost, in target steps, of a drafter first feeding `lag` ids it has not seen (a draft model
        that sat out rounds): its step cost times the extra width of that first forward, taking the
        target's c_v curve as the shape of the draft's (both are decoders on the same kernels)."""
        if lag <= 0:
            return 0.0
        # never below nothing: a profile timed on a busy machine can put c_v(S) under 1
        return self.costs.draft_cost[drafter] * max(0.0, self.costs.cv.wide(lag + 1) - 1.0)

    def stops_on_confidence(self, drafter: str) -> bool:
        """Whether `drafter` is asked for up to K tokens with confidence floors when chosen."""
        return drafter in self.confident

    def floors(self, drafter: str, k: int) -> tuple[float, ...]:
        """Confidence floors of a `k`-token draft by `drafter`: floors[i - 1] is what the product of its
        first i token confidences must reach for it to draft token i + 1; () for a drafter that does not
        stop on its confidence. The floor is set on the chain's chance to survive (see Tuning.stop_rate)
        and read on the drafter's own confidences through their fit to what the target accepted
        (decoding/confidence.py)."""
        if not self.stops_on_confidence(drafter):
            return ()
        cv, step, fit = self.costs.cv, self.costs.draft_cost[drafter], self.fits[drafter]
        return tuple(fit.floor(self.tuning.stop_rate * (step + cv(i + 2) - cv(i + 1))) for i in range(1, k))

    def _finish(self, choice: Choice) -> Choice:
        """A chosen drafter that stops on its own confidence gets its floors and may draft up to k_max
        tokens (as far as the c_v curve reaches): the floors end its chain where one more token is unlikely
        to pay, so the plan's K (set on a chain's α, 2 or 3 tokens at a first-token α of 0.6-0.7) would only
        leave tokens it is sure of on the table; that holds beside prompt lookup as well, which still takes
        every round it prices higher (docs/tuning.md, "deep chains")."""
        if not self.stops_on_confidence(choice.drafter):
            return choice
        top = self.costs.cv.max_s
        k = max(choice.k, self.k_max if top is None else min(self.k_max, top - 1))
        return replace(choice, k=k, floors=self.floors(choice.drafter, k))

    def _overhead(self, drafter: str, lag: int, spread: bool = False) -> float:
        rounds = max(self.tuning.spread_rounds, self.runs.expected(drafter)) if spread else 1.0
        return self.costs.round_overhead + self.tuning.catch_up_weight * self.catch_up(drafter, lag) / rounds

    def plan(self, drafter: str, alpha: float | None = None, lag: int = 0, spread: bool = False) -> Choice:
        """The best K for `drafter` at its estimate (or at `alpha`, as for a chain), ignoring probes; lag
        and spread as for `rate`."""
        if alpha is None and drafter in self.trees:
            tree = self._tree(drafter)
            return self._best_tokens(drafter, tree.expected_tokens, self._overhead(drafter, lag, spread))[0]
        a = self.alpha(drafter) if alpha is None else alpha
        b = best_k(a, self.costs.cv, self.costs.draft_cost[drafter], self.k_max,
                   self._overhead(drafter, lag, spread))
        return Choice(drafter, b.k)

    def decide(self, lags: dict[str, int] | None = None) -> Choice:
        """The best (drafter, K) on the current estimates, without probes and without side effects;
        lags as for `choose`."""
        return self._best(lags or {})[0]

    def _best(self, lags: dict[str, int]) -> tuple[Choice, float]:
        """This round's plan and the rate it was chosen at (see `_best_at`); if that is plain decoding,
        the best again with each lagging drafter's catch-up spread (Tuning.spread_rounds)."""
        best = self._best_at(lags, spread=False)
        if best[0].drafter == NONE and any(lags.get(d, 0) > 0 for d in self.drafters):
            best = self._best_at(lags, spread=True)
        return best

    def _best_at(self, lags: dict[str, int], spread: bool) -> tuple[Choice, float]:
        """The drafter with the best rate at its optimistic α (Tuning.explore), if that beats plain
        decoding, with its rate there. Its round is planned on what is known of its α (`_plan_known`).
        With a catch-up spread over the coming rounds (`spread`) a drafter is chosen only where that plan
        pays: the spread is a bet on those rounds, made on what is known, never on optimism alone."""
        best, best_rate = Choice(NONE, 0), 1.0
        for d in self.drafters:
            if not self.available(d):
                continue
            lag = lags.get(d, 0)
            r = self._optimistic_rate(d, lag, spread)
            if r > best_rate:
                c, known = self._plan_known(d, lag, spread)
                if spread and known <= 1.0:
                    continue
                best, best_rate = c, r
        return best, best_rate

    def _optimistic_rate(self, drafter: str, lag: int, spread: bool) -> float:
        """The drafter's best rate at its optimistic estimate (Tuning.explore standard errors above it,
        at most Tuning.ceiling_alpha): a chain's α, or a tree drafter's a(N) per node budget."""
        t = self.tuning
        if drafter in self.trees:
            tree = self._tree(drafter)
            return self._best_tokens(drafter, lambda k: tree.optimistic_tokens(k, t.explore, t.ceiling_alpha),
                                     self._overhead(drafter, lag, spread))[1]
        a = self._estimate(drafter).upper(t.explore, t.ceiling_alpha)
        chain = self.rate(drafter, self.plan(drafter, a, lag, spread).k, a, lag, spread)
        return self._yielded(drafter, self._overhead(drafter, lag, spread), chain)

    def _yielded(self, drafter: str, overhead: float, rate: float) -> float:
        """`rate`, or a confident drafter's yield if better: what its rounds emitted per target step
        (decoding/round_yield.py), with this round's `overhead` (`_overhead`: its catch-up included) in place
        of the plain round overhead its rounds were costed at."""
        y = self.yields.get(drafter)
        if y is None:
            return rate
        got = y.rate(overhead - self.costs.round_overhead)
        return rate if got is None else max(rate, got)

    def _plan_known(self, drafter: str, lag: int, spread: bool) -> tuple[Choice, float]:
        """The K with the most tokens expected over what is known of the drafter's α (a tree drafter: of
        its a(N)) per unit of its round's cost, and that rate (ties: the smaller K)."""
        overhead = self._overhead(drafter, lag, spread)
        if drafter in self.trees:
            return self._best_tokens(drafter, self._tree(drafter).expected_tokens, overhead)
        est = self._estimate(drafter)
        c, r = self._best_tokens(drafter, lambda k: est.expected_tokens(k, self.tuning.plan_evidence), overhead)
        return c, self._yielded(drafter, overhead, r)

    def _best_tokens(self, drafter: str, tokens, overhead: float) -> tuple[Choice, float]:
        """The K in 1..k_max with the most `tokens(K)` per unit of the round's cost, and that rate
        (ties: the smaller K)."""
        best_k, best = 0, 0.0
        for k in range(1, self.k_max + 1):
            r = tokens(k) / self._cost(drafter, k, overhead)
            if r > best * (1 + 1e-12):
                best_k, best = k, r
        return Choice(drafter, best_k), best

    def probe_period(self, drafter: str) -> float:
        """Rounds between probes of `drafter` while it sits unused: Tuning.reprobe_every, or more where
        a probe that finds nothing (one token for its round's cost) would waste more than the probe
        budget (Tuning.free_probe_budget for a drafter that drafts for free) in target steps per round.
        The catch-up of a lagging drafter is left to `could_beat`. A drafter that drafts at a cost (a
        draft model) judged on fewer than Tuning.probe_evidence tokens is probed every Tuning.reprobe_every
        rounds: one early miss says little of what it can do, and a draft model that sits out gathers a
        lag that soon keeps any probe from winning. One that drafts for free (prompt lookup) gathers no
        lag, and where nothing it offers is kept (text of few distinct ids under a dear verify) early
        probes would only add their waste."""
        t = self.tuning
        if self.costs.draft_cost[drafter] > 0.0 and self.evidence(drafter) < t.probe_evidence:
            return float(t.reprobe_every)
        k = self.plan(drafter, max(self.alpha(drafter), t.probe_alpha)).k
        waste = round_cost(k, self.costs.cv, self.costs.draft_cost[drafter], self.costs.round_overhead) - 1.0
        budget = t.free_probe_budget if self.costs.draft_cost[drafter] == 0.0 else t.probe_budget
        return max(float(t.reprobe_every), waste / budget)

    def evidence(self, drafter: str) -> float:
        """The judged draft tokens (faded) `drafter`'s estimates rest on, over all its situations."""
        return sum(e.trials for (d, _), e in self.estimates.items() if d == drafter)

    def could_beat(self, drafter: str, rate: float, lag: int = 0) -> bool:
        """Whether `drafter` could beat `rate` at all: its best rate if nearly every token were accepted
        (Tuning.ceiling_alpha). A probe that cannot win is not worth its cost (a draft model that must
        first catch up on the text since it last ran, a verify over K + 1 tokens). For the only drafter
        that catch-up is spread over the rounds it would keep the floor if it won (see `spread_rounds`):
        no other drafter takes a round from it, and charged whole, the lag it gathers in plain rounds
        would keep it out for the rest of the answer."""
        top = self.tuning.ceiling_alpha
        spread = len(self.drafters) == 1
        return self.rate(drafter, self.plan(drafter, top, lag, spread).k, top, lag, spread) > rate

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
        best, best_rate = self._best(lags)
        stale = [d for d in self.drafters
                 if d != best.drafter and self.available(d)
                 and self.round - self.last_chosen[d] >= self.probe_period(d)
                 and self.could_beat(d, best_rate, lags.get(d, 0))]
        if stale:
            d = min(stale, key=lambda name: self.last_chosen[name])
            k = self.plan(d, max(self.alpha(d), self.tuning.probe_alpha), lags.get(d, 0)).k
            best = Choice(d, k, probe=True)
        if best.drafter != NONE:
            self.last_chosen[best.drafter] = self.round
        self._last = best.drafter
        return self._finish(best)

    def update(self, drafter: str, drafted: int, accepted: int, nodes: int = 0, path: Sequence[int] = (),
               confidences: Sequence[float] | None = None) -> None:
        """After a round: `drafted` tokens judged (0: the drafter had no candidate), `accepted` kept. A tree
        drafter's round also gives the `nodes` it drafted and the accepted `path` (indices into the draft,
        as Verdict.path; a chain it drafted: 0..accepted-1), which its a(N) estimate learns from. A
        confident drafter's round gives the `confidences` of its tokens (Draft.confidences), which its
        floors are read through."""
        if drafter == NONE:
            return
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        self._estimate(drafter).update(drafted, accepted)
        if drafter in self.yields and drafted:
            self.yields[drafter].update(accepted + 1, self._cost(drafter, drafted, self.costs.round_overhead))
        if drafter in self.fits and confidences:
            self.fits[drafter].update(confidences, drafted, accepted)
        if drafter in self.trees and drafted:
            if nodes < drafted or len(path) != accepted:
                raise ValueError(f"a tree drafter's round needs its nodes and accepted path: got nodes={nodes}, "
                                 f"path={list(path)} for drafted={drafted}, accepted={accepted}")
            self._tree(drafter).update(nodes, path, drafted)

    def _estimate(self, drafter: str, situation: str | None = None) -> AcceptanceEstimate:
        """The estimate of `drafter` in `situation` (default: this round's), made on first use."""
        if drafter not in self.priors:
            raise ValueError(f"unknown drafter {drafter!r}; this controller knows {self.drafters}")
        key = (drafter, (self.situations.get(drafter) or "") if situation is None else situation)
        est = self.estimates.get(key)
        if est is None:
            t = self.tuning
            prior = self.priors[drafter].get(key[1], t.prior_alpha)
            est = self.estimates[key] = AcceptanceEstimate(t.half_life, prior, t.prior_weight)
        return est

    def _tree(self, drafter: str) -> TreeAcceptance:
        """The a(N) estimate of tree drafter `drafter` in this round's situation, made on first use from
        the situation's prior α, as `_estimate`."""
        key = (drafter, self.situations.get(drafter) or "")
        est = self.tree_estimates.get(key)
        if est is None:
            t = self.tuning
            prior = self.priors[drafter].get(key[1], t.prior_alpha)
            est = self.tree_estimates[key] = TreeAcceptance(self.k_max, t.half_life, prior, t.prior_weight)
        return est
