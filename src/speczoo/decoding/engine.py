"""The engine: owns the target model and its KV cache, and runs a request's rounds on them.

One round (decoding/round.py): the pending token a0 (already certain: argmax or sample of the last
target logits) plus a draft of K tokens go through ONE target forward (S = K + 1); the pure verify
functions pick the accepted prefix and the target's own next token; the target cache is rolled back to
the accepted length (O(1)) and the drafter is told what survived. Plain decoding is the same round with
K = 0, so greedy and speculative runs share every line of code but the draft.

A token-tree draft (Draft.parents, not a chain) takes one detour: its N nodes go through one target
forward with the tree attention mask and tree positions (decoding/verify/tree.py), the tree verify picks a root
path, and the path's K/V rows are compacted next to the prefix before the truncation. Chains, and
trees that are chains, never take it.

The engine is the only place that mutates the target's cache. It deals in token ids only: text, stop
strings and detokenization live above it (speczoo/textgen.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Protocol

import torch
from torch import Tensor

from speczoo.events import Stats
from speczoo.request import GenerationRequest
from speczoo import sampling
from speczoo.decoding.pricing.calibrate import CostMeter
from speczoo.decoding.pricing.cost import Costs
from speczoo.decoding.tuning import PRICING
from speczoo.decoding.constraint import GrammarFactory
from speczoo.decoding.penalties import row_penalties
from speczoo.decoding.drafters.base import FeatureTaps
from speczoo.decoding.drafters.registry import DrafterSpec
from speczoo.decoding.logprobs import MAX_TOP, row_logprobs
from speczoo.decoding.modes import AUTO, OFF, SpecMode
from speczoo.decoding.policy import make_policy
from speczoo.decoding.prompt_checks import check_fits
from speczoo.decoding.round import Finished, Generation, RoundPlan, Round, run_round
from speczoo.decoding.types import MAX_K, Verdict
from speczoo.decoding.verify.judge import judge, kept_rows
from speczoo.decoding.verify.tree import TreeLayout
from speczoo.models.forward import Readout, Tree


class ThreadSteer(Protocol):
    """What the engine needs of speczoo/threads.py's Steer: the thread count set for a generation, told
    each decode forward's rows and seconds (answering whether it ran at the count in use: the cost meter
    times only those), and put back when the generation ends."""

    def begin(self) -> None: ...

    def timed(self, s: int, seconds: float) -> bool: ...

    def end(self) -> None: ...


class Rollback(Protocol):
    """What `conclude` needs of a cache: positions count from the sequence's own start (a KVCache, or
    one slot of a SlotCache)."""

    def truncate(self, n: int) -> None: ...

    def compact(self, src: list[int], dst: int) -> None: ...


def first_token(g: Generation, logits: Tensor) -> None:
    """The prefill's last logits row [1, V] chose a0 (argmax, or a draw from the request's generator;
    among the tokens its grammar allows, when it has one). Its log-probability is the raw row's."""
    raw = logits
    if g.grammar is not None:
        logits = sampling.masked(logits, g.grammar.allowed()[None])
    a0 = sampling.pick(logits, g.sampling, g.rng).tolist()[0]
    if g.logprobs is not None:
        g.pending_logprob = row_logprobs(raw, slice(0, 1), [a0], g.logprobs)[0]
    g.start(a0)


def conclude(g: Generation, plan: RoundPlan, logits: Tensor, hidden: list[Tensor], cache: Rollback, base: int,
             layout: TreeLayout | None = None) -> tuple[Verdict, int]:
    """The end of a round's verify, shared by the engine and the batch: the verdict on [a0] + plan.draft
    (decoding/verify/judge.py), the cache rolled back to `base` + a0 + the accepted tokens (a tree's
    accepted path first moved next to the prefix), and the committed rows' features handed to the
    drafters that read them. Returns the verdict and how many draft tokens the target judged.

    logits: [S, V] the verify forward's logits (S = K + 1, or the tree's N + 1 rows of `layout`).
    hidden: the forward's hidden states [S, D] at g.taps.layers ([] when no drafter reads any).
    cache:  the sequence's cache; base: its length before the forward (a0 went to position base).
    """
    penalty = (row_penalties(g.out + [g.pending], plan.draft.tokens, g.sampling, logits.shape[-1])
               if g.sampling.penalized else None)                    # [S, V]; penalized plans are chains
    verdict, judged = judge(plan.draft, logits, g.sampling, g.rng, layout, plan.masks, penalty)
    if g.logprobs is not None:
        # the kept rows chose the accepted tokens, then the next a0; their raw rows, before mask and penalty
        chosen = [plan.draft.tokens[i] for i in verdict.path] + [verdict.next_token]
        g.verified = row_logprobs(logits, kept_rows(verdict, layout), chosen, g.logprobs)
    if layout is not None:
        cache.compact([base + 1 + i for i in verdict.path], base + 1)
    cache.truncate(base + 1 + verdict.accepted)
    g.taps.send(hidden, kept_rows(verdict, layout))
    return verdict, judged


class Engine:
    """Owns the target model's KV cache and the drafters on offer; generates for one request at a time.

    target:   a model with the forward contract of speczoo.models (tokens, positions, cache -> logits).
    cache:    the target's KV cache (preallocated; capacity >= max_seq + MAX_K + 1).
    drafters: the descriptors of the drafters on offer (decoding/drafters/registry.py), each complete (a
              factory, built per request); their order is the controller's order of preference on ties.
    eos_ids:  the ids that end a generation; max_seq: the longest prompt + output a request may reach.
    costs:    measured costs (target c_v curve, round overhead, step_ms) for the per-round controller,
              priced here with each drafter's cost (a new value: the caller's Costs never changes); with
              their step_ms known, greedy requests re-calibrate them from this engine's own timings as
              they run (decoding/pricing/calibrate.py, with `pricing`), across requests; seeded sampled
              requests keep them as loaded. None (oracle models in tests): the controller decides without
              prices, and a drafter that costs something is refused.
    grammars: builds a request's grammar state from its constraint (decoding/constraint.py; the runtime's
              speczoo/grammar.py); None: a request with a constraint is refused.
    steer:    moves the thread count with the cores actually free while a generation runs (speczoo/threads.py
              Steer); None: the count stays as it is. Outputs never depend on it.
    """

    def __init__(self, target, cache, drafters: Iterable[DrafterSpec], eos_ids: list[int], max_seq: int,
                 costs: Costs | None = None, grammars: GrammarFactory | None = None,
                 steer: ThreadSteer | None = None):
        specs = tuple(drafters)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique, got {names}")
        unbound = [s.name for s in specs if s.factory is None]
        if unbound:
            raise ValueError(f"drafters {unbound} have no factory yet: bind them to what a runtime loaded "
                             f"(DrafterSpec.bound) before offering them")
        priced = {s.name: s.cost for s in specs if s.cost is not None}
        if costs is None and any(priced.values()):
            raise ValueError(f"drafters {sorted(n for n, c in priced.items() if c)} come with a cost but this "
                             f"engine has no cost profile to price them against")
        self.target = target
        self.cache = cache
        self.drafters: Mapping[str, DrafterSpec] = MappingProxyType(dict(zip(names, specs)))
        self.eos = frozenset(eos_ids)
        self.max_seq = max_seq
        self.costs = None if costs is None else costs.priced(priced)   # for the controller
        self.pricing = PRICING        # how `meter` calibrates them (a bench may set another Pricing)
        self.grammars = grammars
        self.steer = steer
        self._meter: CostMeter | None = None

    @property
    def meter(self) -> CostMeter | None:
        """The online calibration of `costs` (None without costs or their step_ms); it starts afresh
        when `costs` or `pricing` is replaced."""
        if self.costs is None or self.costs.step_ms is None:
            return None
        if self._meter is None or self._meter.profile is not self.costs or self._meter.pricing is not self.pricing:
            self._meter = CostMeter(self.costs, self.pricing)
        return self._meter

    def offer(self, spec: DrafterSpec) -> Engine:
        """A new engine that also offers `spec` (in place of a drafter of its name), on the same target,
        cache, costs and Pricing; this one is unchanged. The new one calibrates afresh."""
        return self.offering([*(s for s in self.drafters.values() if s.name != spec.name), spec])

    def offering(self, drafters: Iterable[DrafterSpec]) -> Engine:
        """A new engine that offers `drafters` instead, on the same target, cache, costs, Pricing and thread
        steering; this one is unchanged. The new one calibrates afresh."""
        engine = Engine(self.target, self.cache, drafters, list(self.eos), self.max_seq, self.costs, self.grammars,
                        self.steer)
        engine.pricing = self.pricing
        return engine

    # -- validation -------------------------------------------------------------------------
    def _check(self, req: GenerationRequest) -> None:
        sampling.validate(req.sampling)
        if not req.prompt_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if not 1 <= req.k <= MAX_K:
            raise ValueError(f"K (draft tokens per round) must be in 1..{MAX_K}, got {req.k}")
        if req.ngram < 1:
            raise ValueError(f"n-gram order must be >= 1, got {req.ngram}")
        if req.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {req.max_new_tokens}")
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP:
            raise ValueError(f"top logprobs must be in 0..{MAX_TOP}, got {req.logprobs}")
        self._drafter_names(req.spec)
        mode = SpecMode.parse(req.spec, offered=self.drafters)
        if mode.name is not None and mode.name not in self.drafters[mode.mode].names:
            raise ValueError(f"speculative mode {req.spec!r} names {mode.takes} {mode.name!r}, but this engine's "
                             f"{mode.mode!r} drafts with {' / '.join(self.drafters[mode.mode].names) or 'another'}: "
                             f"load {mode.name!r} with the runtime (--spec {req.spec} on the command line)")
        check_fits(len(req.prompt_ids), req.max_new_tokens, self.max_seq)
        if req.constraint is not None and self.grammars is None:
            raise ValueError("this engine has no grammar compiler, so it cannot constrain the output: "
                             "generate through a runtime (speczoo.runtime), which builds one from its tokenizer")

    # -- target calls -----------------------------------------------------------------------
    def _forward(self, ids: list[int]) -> torch.Tensor:
        """Run the target over `ids` at the next positions; returns logits [S, V]."""
        return self._forward_out(ids).logits

    def _forward_out(self, ids: list[int], layers: tuple[int, ...] = (), logit_rows: slice | None = None):
        """The same forward's whole output: logits [S, V] (or the rows `logit_rows` asks for) and the
        hidden states [S, D] of `layers`."""
        start = self.cache.length
        tokens = torch.tensor(ids, dtype=torch.long)
        positions = torch.arange(start, start + len(ids), dtype=torch.long)
        return self.target(tokens, positions, self.cache, readout=Readout(logit_rows=logit_rows, hidden_layers=layers))

    def score(self, ids: list[int]) -> torch.Tensor:
        """The target's logits [V] for the token after `ids` (a fresh prefill; for diagnostics)."""
        self.cache.reset()
        logits = self._forward(ids)[-1]
        self.cache.reset()
        return logits

    # -- the generation ---------------------------------------------------------------------
    def generate(self, req: GenerationRequest) -> Iterator[Round | Finished]:
        """Validate the request now (errors raise before any event), then stream one `Round` per round
        and the final `Finished`."""
        g = self.open(req)
        return self._events(g)

    def _events(self, g: Generation) -> Iterator[Round | Finished]:
        yield from self.rounds(g)
        yield g.result()

    def open(self, req: GenerationRequest, only: frozenset[str] | None = None) -> Generation:
        """Validate the request and build its state: its drafters (from their factories), the policy
        over them, the feature taps and the random generator of a sampled request. No model runs yet.
        only: the drafters this request may have (None: all; a batch offers those that keep their state
        per request, and lends one that shares its cache), "auto" then offering the ones among them."""
        self._check(req)
        greedy = req.sampling.greedy
        names = self._drafter_names(req.spec)
        if only is not None:
            if SpecMode.parse(req.spec, offered=self.drafters).mode not in (OFF, AUTO) and names[0] not in only:
                why = ("its drafter shares one cache across requests" if self.drafters[names[0]].shared_cache
                       else "its drafter cannot run in a batch")
                raise ValueError(f"speculative mode {req.spec!r} cannot run in a batch ({why}); a batch offers "
                                 f"{[OFF, AUTO, *sorted(only)]}")
            names = [n for n in names if n in only]
        drafters = {name: self.drafters[name].factory(req) for name in names}
        # Calibrated costs make the controller's choices depend on timing. Greedy output cannot change
        # with them; a sampled text would (which draft tokens meet which random numbers), so a request
        # that sampled with a seed decides on the loaded profile alone and reproduces its text run after run.
        meter = self.meter if greedy or req.sampling.seed is None else None
        policy = make_policy(req, drafters, meter.costs() if meter is not None else self.costs)
        grammar = None if req.constraint is None else self.grammars(req.constraint)
        return Generation(drafters, policy, list(req.prompt_ids), req.max_new_tokens, self.eos, meter,
                          taps=FeatureTaps(drafters.values()),    # target hidden states the drafters read (EAGLE)
                          sampling=req.sampling, rng=None if greedy else sampling.make_generator(req.sampling.seed),
                          grammar=grammar,
                          stats=Stats(prompt_tokens=len(req.prompt_ids), drafter=req.spec), logprobs=req.logprobs)

    def rounds(self, g: Generation) -> Iterator[Round]:
        """Prefill, then one round per target forward until the generation finishes. Closing the
        iterator early ends the generation; its stats then cover what ran."""
        if self.steer is not None:
            self.steer.begin()
        try:
            yield from self._rounds(g)
        finally:
            if self.steer is not None:
                self.steer.end()

    def _rounds(self, g: Generation) -> Iterator[Round]:
        self.cache.reset()
        t0 = time.perf_counter()
        fwd = self._forward_out(g.context, g.taps.layers, logit_rows=slice(-1, None))  # the last row's logits
        first_token(g, fwd.logits[-1:])
        g.taps.send(fwd.hidden)                # the prompt's features first: a head ingests them in prefill
        for d in g.drafters.values():
            d.prefill(g.context)
        t1 = time.perf_counter()
        g.stats.prefill_seconds = t1 - t0
        verify = self._verify
        try:
            while g.finish is None:
                yield run_round(g, verify)
        finally:
            g.stats.seconds = time.perf_counter() - t1
            g.stats.new_tokens = len(g.out)
            g.end()

    def _verify(self, g: Generation, plan: RoundPlan) -> tuple[Verdict, int]:
        """The target's verdict on [a0] + the plan's draft: one forward (a chain, S = K + 1; or the tree's
        N + 1 nodes with the tree mask and tree positions), then the shared verify and rollback."""
        base = self.cache.length
        tokens = [g.pending] + plan.draft.tokens
        t = time.perf_counter()
        if plan.chain:
            fwd = self._forward_out(tokens, g.taps.layers)
            layout = None
        else:
            layout = TreeLayout.from_parents(plan.draft.parents)
            fwd = self.target(torch.tensor(tokens, dtype=torch.long), layout.positions(base), self.cache,
                              attend=Tree(layout.mask), readout=Readout(hidden_layers=g.taps.layers))   # logits [N+1, V]
        if self.steer is not None:
            g.settled = self.steer.timed(len(tokens), time.perf_counter() - t)
        return conclude(g, plan, fwd.logits, fwd.hidden, self.cache, base, layout)

    def _drafter_names(self, spec: str) -> list[str]:
        """Which drafters a spec mode may use: "off" none; "auto" every one offered that `auto` may pick."""
        mode = SpecMode.parse(spec, offered=self.drafters).mode
        if mode == OFF:
            return []
        if mode == AUTO:
            return [name for name, s in self.drafters.items() if s.auto]
        return [mode]
