"""One round of speculative decoding, as a value, and the per-request state that rounds advance.

A round: the policy chooses a drafter and K, the drafter proposes, the target verifies [a0] + draft,
the target cache is rolled back to the accepted length, and drafters and policy are told what
survived. `run_round` is that round, in three phases that a batch of requests can interleave:

    plan(g)                         choose + propose: the draft to verify after a0 (a `RoundPlan`)
    verify(g, plan)                 whoever owns the target: forward, verify, roll back (a `Verifier`)
    settle(g, plan, verdict, ...)   commit to drafters and policy, extend the output: the `Round`

The engine verifies with a real target forward (decoding/engine.py); the offline replays
(benchmarks/auto_replay.py, decoding/eagle_replay.py) verify against a recorded greedy continuation
(`verify_recorded`). Both drive this same `run_round`, so a replay judges exactly the engine's logic.

Ids only: nothing here sees text, a model or a cache; `Generation` holds one request's state (its
drafters, policy, committed ids, pending token, stats), so that the engine itself keeps none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from speczoo.events import Stats, TokenLogprob
from speczoo.request import SamplingParams
from speczoo.decoding.pricing.calibrate import CostMeter
from speczoo.decoding.constraint import Grammar, constrain, first_path
from speczoo.decoding.controller import NONE, Controller
from speczoo.decoding.drafters.base import Drafter, FeatureTaps
from speczoo.decoding.types import Draft, Verdict
from speczoo.decoding.verify.greedy import verify_greedy, verify_tree_greedy
from speczoo.decoding.verify.tree import TreeLayout, is_chain

NO_TAPS = FeatureTaps(())


@dataclass(frozen=True, slots=True)
class Round:
    """What one round did: the ids it emits and how they were drafted.

    ids:      a0 and the accepted draft tokens, cut before an EOS (the output grows by these)
    drafted:  draft tokens verified (0: a plain round)
    accepted: of which accepted
    drafter:  the drafter chosen ("none": plain decoding)
    pending:  the next round's a0 (the target's correction or bonus token)
    finish:   "stop" (EOS), "length" (max_new_tokens reached) or None (the generation goes on)
    logprobs: one per id, when the request asked (Generation.logprobs)
    """

    ids: list[int]
    drafted: int
    accepted: int
    drafter: str
    pending: int
    finish: str | None
    logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a generation: why it ended, every id it emitted, and its stats."""

    finish_reason: str              # "stop" (EOS or stop string) | "length"
    ids: list[int]
    stats: Stats
    logprobs: list[TokenLogprob] | None = None      # one per id, when the request asked


@dataclass(slots=True)
class RoundPlan:
    """What a round verifies: `draft` after a0, proposed by `drafter` (NONE: plain decoding); verify
    False for the last token of the budget, emitted without a forward. A constrained generation's plan
    carries the grammar's `masks` [K + 1, V] of its rows and the draft tokens the grammar `consumed`
    (decoding/constraint.py)."""

    drafter: str
    draft: Draft
    chain: bool = True
    verify: bool = True
    masks: Tensor | None = None
    consumed: int = 0


@dataclass(slots=True, eq=False)
class Generation:
    """One request's state between rounds.

    drafters: this request's drafters by name; policy: the controller choosing among them (or anything
              with its choose / update, and use_costs when a meter is given).
    context:  every committed id (prompt + output); pending: a0, chosen by the target, not emitted yet.
    meter:    the online calibration the rounds time themselves into (None: no timing).
    taps, sampling, rng: the engine's side (features to hand the drafters, the request's sampling and
    its random generator); a replay leaves them at their defaults.
    logprobs: the alternatives per emitted token the request asked for (None: no log-probabilities);
    the engine's verify leaves in `verified` the TokenLogprobs of the rows the verdict kept (the accepted
    draft tokens, then the next a0), and `pending_logprob` carries a0's from the row that chose it.
    grammar:  the request's grammar state (decoding/constraint.py), advanced through context[prompt:] and
              pending between rounds; None: unconstrained.
    settled:  whether the latest verify ran at the thread count in use; False in a try of another count
              (speczoo/thread_pilot.py), whose time the meter must not price the count in use with.
    """

    drafters: dict[str, Drafter]
    policy: Controller
    context: list[int]
    max_new: int
    eos: frozenset[int] = frozenset()
    meter: CostMeter | None = None
    taps: FeatureTaps = NO_TAPS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rng: torch.Generator | None = None
    grammar: Grammar | None = None
    pending: int = -1
    out: list[int] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    finish: str | None = None
    logprobs: int | None = None
    verified: list[TokenLogprob] = field(default_factory=list)
    pending_logprob: TokenLogprob | None = None
    out_logprobs: list[TokenLogprob] = field(default_factory=list)
    ended: bool = False
    settled: bool = True

    @property
    def remaining(self) -> int:
        return self.max_new - len(self.out)

    def start(self, pending: int) -> None:
        """The prefill chose a0: the rounds can begin (none when it is an EOS)."""
        self.pending = pending
        if self.grammar is not None:
            self.grammar.consume(pending)
        if pending in self.eos:
            self.finish = "stop"

    def result(self, finish: str | None = None) -> Finished:
        """The generation as it stands, ended for `finish` (default: its own reason)."""
        return Finished(finish or self.finish or "length", self.out, self.stats,
                        None if self.logprobs is None else self.out_logprobs)

    def end(self) -> None:
        """Tell the drafters the generation is over, with its committed ids (Drafter.finish); once, however
        it ended. Whoever runs the rounds calls it (the engine, the batch)."""
        if not self.ended:
            self.ended = True
            for d in self.drafters.values():
                d.finish(self.context)


# (g, plan) -> (verdict, draft tokens the target judged): forward, verify and roll back one plan
Verifier = Callable[[Generation, RoundPlan], tuple[Verdict, int]]


def run_round(g: Generation, verify: Verifier) -> Round:
    """One round: choose and propose, verify and roll back, commit; the generation `g` advances by it.

    verify: whoever owns the target (the engine's forward, or a replay's recording) turns the plan into
            the verdict and the count of draft tokens judged. The round's time feeds g.meter (unless the
            verify left g.settled False: a try of another thread count), which hands the policy
            re-calibrated costs every Pricing.recalibrate_every rounds.
    """
    p = plan(g)
    if not p.verify:
        return settle(g, p, None, 0)
    t = time.perf_counter()
    verdict, judged = verify(g, p)
    r = settle(g, p, verdict, judged)
    if g.meter is not None:
        if g.settled:
            g.meter.forward(1 + p.draft.k, time.perf_counter() - t)
        if g.meter.due(g.stats.rounds):
            g.policy.use_costs(g.meter.costs())
    return r


def plan(g: Generation) -> RoundPlan:
    """The policy's choice and the chosen drafter's draft (empty when it has no candidate: a plain
    round). The last token of the budget is emitted as it is (no draft, no forward). A constrained
    generation's draft is a chain cut where its grammar forbids a token, with the rows' masks; a
    penalized one's (decoding/penalties.py) is a chain too."""
    p = _proposal(g)
    if not p.verify or (g.grammar is None and not g.sampling.penalized):
        return p
    if g.grammar is None:
        return p if p.chain else RoundPlan(p.drafter, first_path(p.draft))
    c = constrain(g.grammar, p.draft)
    return RoundPlan(p.drafter, c.draft, masks=c.masks, consumed=c.consumed)


def _proposal(g: Generation) -> RoundPlan:
    remaining = g.remaining
    if remaining == 1:
        return RoundPlan(NONE, Draft(tokens=[]), verify=False)
    drafters = g.drafters
    ctx = g.context + [g.pending] if drafters else g.context     # what the drafters see (plain: no one)
    lags = {name: d.lag(ctx) for name, d in drafters.items()}
    choice = g.policy.choose(lags, situations(drafters, ctx))
    if not choice.drafting:
        return RoundPlan(NONE, Draft(tokens=[]))
    k = min(choice.k, remaining - 1)
    t = time.perf_counter()
    draft = drafters[choice.drafter].propose(ctx, k, choice.floors).truncated(k)
    if g.meter is not None and g.meter.in_step(lags[choice.drafter]):      # no catch-up in its time
        g.meter.draft(choice.drafter, draft.k if draft.work is None else draft.work, time.perf_counter() - t)
    return RoundPlan(choice.drafter, draft, is_chain(draft.parents))


def situations(drafters: dict[str, Drafter], ctx: list[int]) -> dict[str, str | None]:
    """Each drafter's situation this round (Drafter.situation; None: nothing to propose). Beside chain
    drafters, a tree drafter is offered only where its tree would branch (Drafter.branches): elsewhere its
    first nodes are a chain's, and two drafters offering the same tokens would each learn half of what the
    situation teaches. Alone (`--spec ngram-tree`) it is offered wherever it has a proposal."""
    chains = any(not d.drafts_trees for d in drafters.values())
    return {name: None if chains and d.drafts_trees and not d.branches(ctx) else d.situation(ctx)
            for name, d in drafters.items()}


def settle(g: Generation, p: RoundPlan, verdict: Verdict | None, judged: int) -> Round:
    """Tell the drafter and the policy what the target accepted; emit a0 and the accepted tokens (up to
    an EOS); the target's own token becomes the next a0.

    p: the round's plan; verdict: the target's (None: the last token of the budget, emitted unverified);
    judged: the draft tokens the target ruled on (decoding/verify/__init__.py), what the policy counts.
    """
    draft = p.draft
    if verdict is None:
        new, accepted, pending = [g.pending], 0, g.pending
    else:
        accepted = verdict.accepted
        if p.chain:
            new = [g.pending] + draft.tokens[:accepted]
            if p.drafter != NONE:
                g.drafters[p.drafter].commit(accepted)
        else:
            new = [g.pending] + [draft.tokens[i] for i in verdict.path]
            g.drafters[p.drafter].commit_path(verdict.path)
        if p.drafter != NONE:
            g.policy.update(p.drafter, judged, accepted, draft.k, verdict.path, draft.confidences)
        stats = g.stats
        stats.rounds += 1
        stats.drafted += draft.k
        stats.accepted += accepted
        pending = verdict.next_token
        if g.grammar is not None:                    # back to the accepted length, then the target's token
            g.grammar.rollback(p.consumed - accepted)
            g.grammar.consume(pending)
    logprobs = None if g.logprobs is None else _emitted_logprobs(g, accepted, verdict is not None)
    finish = None
    if g.eos and not g.eos.isdisjoint(new):          # EOS inside the accepted run ends generation there
        new = new[:next(i for i, t in enumerate(new) if t in g.eos)]
        finish = "stop"
    if logprobs is not None:
        logprobs = logprobs[:len(new)]
        g.out_logprobs.extend(logprobs)
    g.out.extend(new)
    g.context.extend(new)
    if finish is None:
        if len(g.out) >= g.max_new:
            finish = "length"
        elif pending in g.eos:
            finish = "stop"
    g.pending, g.finish = pending, finish
    return Round(new, draft.k, accepted, p.drafter, pending, finish, logprobs)


def _emitted_logprobs(g: Generation, accepted: int, verified: bool) -> list[TokenLogprob]:
    """The log-probabilities of a0 and the accepted draft tokens (their verified rows); the next a0's
    row is kept for the next round."""
    out = [g.pending_logprob] + g.verified[:accepted]
    if verified:
        g.pending_logprob = g.verified[accepted]
    g.verified = []
    return out


def verify_recorded(p: RoundPlan, out: list[int], at: int) -> tuple[Verdict, int]:
    """Greedy verification against a known continuation, for replays: `out` is the target's greedy
    output and out[at] the round's a0, so the verify forward's row r would hold out[at + 1 + r] (-1
    past the recording's end). The same pure verify functions as the engine's greedy rounds."""
    draft = p.draft
    truth = out[at + 1:at + 2 + draft.k]
    if p.chain:
        rows = truth + [-1] * (draft.k + 1 - len(truth))
        return verify_greedy(draft, rows), draft.k
    layout = TreeLayout.from_parents(draft.parents)
    rows = [truth[d] if d < len(truth) else -1 for d in layout.depth.tolist()]
    verdict = verify_tree_greedy(draft, layout, rows)
    return verdict, layout.judged(verdict.path)
