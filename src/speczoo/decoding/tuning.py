"""Every constant that shapes a decoding decision, in four frozen values:

  Tuning    the controller's choice of drafter and K (decoding/controller.py), passed whole to it;
  Pricing   how the costs it decides with are measured and kept current (decoding/pricing/);
  Drafting  what the drafters decide on their own: prompt lookup's situations and trees, the draft
            model's head and guesses, EAGLE's trees (decoding/drafters/);
  Batching  how the continuous batch shares a step (decoding/batch.py).
Each field says what it sets and why; how its value was measured, and what it bought on the offline
replay (`python -m benchmarks.auto_replay --replay F --profile cheap-verify,dear-verify,dear-draft`) or
live, is docs/tuning.md, one row per field. Costs are not tuning: they are measured per machine (Costs,
decoding/pricing/cost.py). The shipped values are TUNING, PRICING, DRAFTING and BATCHING; a bench that
tries another value passes its own (dataclasses.replace) where the value is taken. Plain values: never
read a model, a cache or a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from speczoo.decoding.types import MAX_K


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
    probe_evidence: a drafter that drafts at a cost (a draft model, which lags while it sits out) judged
                    on fewer draft tokens than this is probed every reprobe_every rounds, whatever a probe
                    costs: too little is known of it to write it off.
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
    run_prior:      the run length of a drafter expected before any of its runs has ended (decoding/runs.py:
                    what a catch-up is spread over, with spread_rounds).
    run_weight:     the weight of the latest run in that running mean (runs change with the text).
    yield_weight:   it is also priced by what its rounds yielded (decoding/round_yield.py: tokens per
                    round over cost per round, the better of that and its α's rate); the weight of the
                    latest round in those running means.
    yield_rounds:   its rounds before that yield is used.
    confidence_half_life: its floors are read through a fit of its confidences to what the target
                    accepted (decoding/confidence.py); judged tokens after which that evidence counts half.
    confidence_prior: how many judged tokens the fit's prior (the confidences taken at their word) is
                    worth.
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
    probe_evidence: float = 4.0
    catch_up_weight: float = 2.0
    spread_rounds: float = 8.0
    stop_rate: float = 1.5
    run_prior: float = 0.5
    run_weight: float = 0.5
    yield_weight: float = 0.125
    yield_rounds: int = 2
    confidence_half_life: float = 64.0
    confidence_prior: float = 16.0

    def __post_init__(self) -> None:
        bad = []
        for name in ("explore", "plan_evidence", "stop_rate", "probe_evidence"):
            if not getattr(self, name) >= 0:
                bad.append(f"{name} must be >= 0")
        for name in ("half_life", "prior_weight", "probe_budget", "free_probe_budget", "spread_rounds",
                     "run_prior", "confidence_half_life", "confidence_prior"):
            if not getattr(self, name) > 0:
                bad.append(f"{name} must be > 0")
        for name in ("ceiling_alpha", "prior_alpha", "probe_alpha"):
            if not 0.0 <= getattr(self, name) < 1.0:
                bad.append(f"{name} must be in [0, 1)")
        if not 0.0 < self.prior_alpha:
            bad.append("prior_alpha must be > 0")
        if not 0.0 < self.run_weight <= 1.0:
            bad.append("run_weight must be in (0, 1]")
        if not 0.0 < self.yield_weight <= 1.0:
            bad.append("yield_weight must be in (0, 1]")
        if self.yield_rounds < 1:
            bad.append("yield_rounds must be >= 1 round")
        if self.reprobe_every < 1:
            bad.append("reprobe_every must be >= 1 round")
        if not self.catch_up_weight >= 1.0:
            bad.append("catch_up_weight must be >= 1")
        bad += [f"{n} must be finite" for n, v in vars(self).items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"bad controller tuning: {'; '.join(bad)} (got {self})")


def _finite(value, infinite_ok: tuple[str, ...] = ()) -> list[str]:
    return [f"{n} must be finite" for n, v in vars(value).items()
            if isinstance(v, float) and not math.isfinite(v) and n not in infinite_ok]


@dataclass(frozen=True)
class Pricing:
    """How the controller's costs are measured and kept in step with the machine (decoding/pricing/).

    At load (pricing/profile.py):
    round_overhead:   the fixed cost of a round outside the target forward, in target steps (a price
                      the profile cannot time: measured by benchmarks/round_overhead.py).
    profile_budget_steps: decode steps (as a probe times one on this machine) a first-load cost profile
                      may take, all of it: the budget follows the CPU and its load, so a slower or busier
                      machine still times everything (up to profile_budget_max_s), where a fixed number of
                      seconds would cut it short.
    profile_budget_max_s: the wall clock it may take at the most, whatever a step costs: a slow kernel
                      path times S = 1 and 3 only and fits the rest (stored, marked as fitted).
    cv_reach:         a measured c_v curve is extrapolated up to this multiple of its largest S, no
                      further (pricing/cost.py): past it a forward's cost is a guess.
    one_row_rounds, one_row_block: the one-row forward is timed with and without the kernels' software
                      prefetch (pricing/one_row.py) in this many rounds of this many forwards each way...
    one_row_max_s:    ...within this many seconds (fewer rounds where it would not hold them; under two, no
                      choice: the default, no prefetch);
    one_row_margin:   the prefetch is kept when it won every round and saved this fraction of the time.
    While generating (pricing/calibrate.py, decoding/round.py):
    recalibrate_every: rounds between handing the controller re-calibrated costs.
    in_step_lag:      a proposal is timed as the drafter's step only when the drafter had at most this
                      many ids to catch up first (a catch-up forward is wider, so it would price the
                      drafter's step too dear).
    half_life:        observations of one forward size (or one drafter) after which an old one counts half.
    min_weight:       the evidence (about two observations) before a running mean replaces the profile.
    stale_half_life:  target forwards without a measurement of a drafter (or of a forward size) after
                      which its evidence counts half: a price measured in a bad moment fades back to the
                      profile's, so a drafter (a draft depth) priced out is tried again (inf: never, a
                      bench's "no fading").
    """

    round_overhead: float = 0.02
    profile_budget_steps: float = 300.0
    profile_budget_max_s: float = 60.0
    cv_reach: float = 2.0
    one_row_rounds: int = 3
    one_row_block: int = 4
    one_row_max_s: float = 8.0
    one_row_margin: float = 0.02
    recalibrate_every: int = 4
    in_step_lag: int = 2
    half_life: float = 8.0
    min_weight: float = 1.5
    stale_half_life: float = 64.0

    def __post_init__(self) -> None:
        bad = [f"{n} must be > 0" for n in ("profile_budget_steps", "profile_budget_max_s", "half_life", "min_weight",
                                             "stale_half_life", "one_row_block", "one_row_max_s")
               if not getattr(self, n) > 0]
        if not 0 <= self.one_row_margin < 1:
            bad.append("one_row_margin must be in [0, 1)")
        if self.one_row_rounds < 2:
            bad.append("one_row_rounds must be >= 2 (one round cannot tell a phase of the machine from the prefetch)")
        if not self.round_overhead >= 0:
            bad.append("round_overhead must be >= 0")
        if not self.cv_reach >= 1:
            bad.append("cv_reach must be >= 1")
        if self.recalibrate_every < 1:
            bad.append("recalibrate_every must be >= 1 round")
        if self.in_step_lag < 0:
            bad.append("in_step_lag must be >= 0")
        bad += _finite(self, infinite_ok=("stale_half_life",))
        if bad:
            raise ValueError(f"bad pricing: {'; '.join(bad)} (got {self})")


# P(first draft token accepted) per prompt-lookup situation, measured offline on the greedy outputs of the
# built-in suite with the 1.5B, prompt lookup copying the occurrence that matches furthest back (docs/tuning.md,
# `python -m benchmarks.ngram_situations`).
_SITUATION_PRIORS = MappingProxyType({"1/agree": 0.41, "1/mixed": 0.13, "2-3/agree": 0.60, "2-3/mixed": 0.17,
                                      "4-7/agree": 0.82, "4-7/mixed": 0.43, "8+/agree": 0.95, "8+/mixed": 0.95})


@dataclass(frozen=True)
class Drafting:
    """What the drafters decide on their own, before and besides the controller (decoding/drafters/).

    Prompt lookup (drafters/ngram.py, ngram_tree.py):
    match_cap:        a match is measured backwards up to this many tokens (only its band matters:
                      1, 2-3, 4-7, 8+).
    agree_window:     the most recent occurrences of the suffix whose next tokens must agree for the
                      situation to be "agree", and among which prompt lookup picks the one to copy.
    lookup_reach:     how far back those occurrences' matches are compared: prompt lookup copies the one
                      whose match reaches furthest back (the most recent of those that tie).
    situation_priors: per situation "<band>/<agree|mixed>", α before any evidence there: where the
                      controller's estimate (and the draft model's guesses) start.
    tree_matches:     the most recent occurrences per order a prompt-lookup tree merges.
    tree_order_weight: a candidate whose match reaches m ids back weighs tree_order_weight^m (longer
                      matches count more).
    tree_decay:       the chance a tree path's next step is right, in the trie's node scores.
    The draft model (drafters/draft_model.py, draft_head.py, guess.py):
    head_vocab:       it proposes from a reduced LM head over the first head_vocab ids (plus the prompt's
                      own): a cheaper step, and acceptance lost only on rarer ids.
    head_extra_strips: the most 16-id head strips kept for a prompt's rarer ids.
    guess_max:        the most prompt-lookup guesses fed along with one draft step.
    guess_order:      the longest suffix prompt lookup matches for a guess.
    guess_prior:      a guess's confirmation rate before evidence in a situation without a prior.
    catch_up_window:  after sitting out rounds it feeds only the last this many ids it missed (0: all):
                      its catch-up then costs a bounded forward however long prompt lookup copied, and a
                      controller that prices that cost does not lock it out after long copies.
    EAGLE trees (drafters/eagle.py, `--spec eagle-tree`):
    eagle_tree_depth: the longest path a tree proposes.
    eagle_tree_branch: children tried per expanded node, and nodes expanded per depth.
    The suffix drafter and its memory of earlier answers (drafters/suffix.py, suffix_memory.py):
    suffix_memory_tokens: the memory's default cap, in tokens of all tenants together (`speczoo serve
                      --suffix-memory-tokens`); past it the oldest answers are evicted.
    suffix_orders:    the n-gram orders the memory indexes (lo, hi): a lookup tries the longest first;
                      shorter ones match too much unrelated text in a large memory.
    suffix_lead:      prompt ids remembered before each answer, so that a repeated request's answer is
                      found from its first token (its prompt's tail matches).
    suffix_matches:   the most recent occurrences of the matched suffix, per source (own ids, memory),
                      whose continuations are counted: what bounds a round's cost.
    suffix_spec_factor: a draft is at most this many tokens per matched token (SuffixDecoding's
                      max_spec = α · match length): a short match is drafted short.
    suffix_min_prob:  a draft stops where its continuation's empirical probability (the product of the
                      chosen tokens' shares among the occurrences still agreeing) falls below this.
    """

    match_cap: int = 16
    agree_window: int = 8
    lookup_reach: int = 32
    situation_priors: Mapping[str, float] = field(default_factory=lambda: _SITUATION_PRIORS, hash=False)
    tree_matches: int = 4
    tree_order_weight: float = 4.0
    tree_decay: float = 0.8
    head_vocab: int = 32768
    head_extra_strips: int = 256
    guess_max: int = 8
    guess_order: int = 3
    guess_prior: float = 0.5
    catch_up_window: int = 16
    eagle_tree_depth: int = 6
    eagle_tree_branch: int = 4
    suffix_memory_tokens: int = 262144
    suffix_orders: tuple[int, int] = (2, 6)
    suffix_lead: int = 16
    suffix_matches: int = 8
    suffix_spec_factor: float = 1.0
    suffix_min_prob: float = 0.1

    @property
    def draft_cache_margin(self) -> int:
        """Rows a draft model's cache holds past max_seq: a proposal's own tokens (up to MAX_K), the
        guessed ids fed along with its last step (up to MAX_K), the context's last id fed again, and one
        spare. A bound, not a choice: any fewer and a long proposal at the end of the context overflows."""
        return 2 * MAX_K + 2

    def __post_init__(self) -> None:
        bad = [f"{n} must be >= 1" for n in ("match_cap", "agree_window", "lookup_reach", "tree_matches",
                                              "head_vocab", "guess_order", "eagle_tree_depth", "eagle_tree_branch")
               if getattr(self, n) < 1]
        if self.catch_up_window < 0:
            bad.append("catch_up_window must be >= 0")
        if self.suffix_memory_tokens < 0 or self.suffix_lead < 0:
            bad.append("suffix_memory_tokens and suffix_lead must be >= 0")
        if not 1 <= self.suffix_orders[0] <= self.suffix_orders[1]:
            bad.append("suffix_orders must be (lo, hi) with 1 <= lo <= hi")
        if self.suffix_matches < 1 or not self.suffix_spec_factor > 0:
            bad.append("suffix_matches must be >= 1 and suffix_spec_factor > 0")
        if not 0.0 <= self.suffix_min_prob < 1.0:
            bad.append("suffix_min_prob must be in [0, 1)")
        if self.head_extra_strips < 0 or self.guess_max < 0:
            bad.append("head_extra_strips and guess_max must be >= 0")
        if not self.tree_order_weight >= 1.0:
            bad.append("tree_order_weight must be >= 1")
        if not 0.0 < self.tree_decay < 1.0:
            bad.append("tree_decay must be in (0, 1)")
        if not 0.0 < self.guess_prior < 1.0:
            bad.append("guess_prior must be in (0, 1)")
        out = {k: a for k, a in self.situation_priors.items() if not 0.0 < a < 1.0}
        if out:
            bad.append(f"situation priors must be in (0, 1), got {out}")
        bad += _finite(self)
        if bad:
            raise ValueError(f"bad drafting constants: {'; '.join(bad)} (got {self})")


@dataclass(frozen=True)
class Batching:
    """How the continuous batch (decoding/batch.py) shares one target forward per step.

    chunk: prompt rows per step, over every sequence still prefilling (oldest first): a long prompt is
           fed in pieces, so the sequences already decoding keep streaming while it prefills.
    """

    chunk: int = 128

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"the prefill chunk must be >= 1 row, got {self.chunk}")


TUNING = Tuning()
PRICING = Pricing()
DRAFTING = Drafting()
BATCHING = Batching()
