"""The round loop of speculative decoding, and the only place that mutates caches.

One round: the pending token a0 (already certain: argmax or sample of the last target logits) plus a
draft of K tokens go through ONE target forward (S = K + 1); the pure verify functions pick the
accepted prefix and the target's own next token; the target cache is rolled back to the accepted
length (O(1)) and the drafter is told what survived. Plain decoding is the same loop with K = 0, so
greedy and speculative runs share every line of code but the draft.

A token-tree draft (Draft.parents, not a chain) takes one detour: its N nodes go through one target
forward with the tree attention mask and tree positions (decoding/tree.py), the tree verify picks a root
path, and the path's K/V rows are compacted next to the prefix before the truncation. Chains, and
trees that are chains, never take it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from speczoo.errors import CacheFullError
from speczoo.events import DoneEvent, GenerationRequest, Stats, TokenEvent
from speczoo import sampling
from speczoo.decoding.calibrate import CostMeter
from speczoo.decoding.controller import Costs
from speczoo.decoding.drafters.base import Drafter, FeatureTaps
from speczoo.decoding.policy import make_policy
from speczoo.decoding.textstream import TextStream
from speczoo.decoding.tree import TreeLayout, head, is_chain, verify_tree_greedy
from speczoo.decoding.tree_sampling import verify_tree_sampling
from speczoo.decoding.types import Draft, Verdict
from speczoo.decoding.verify import verify_greedy
from speczoo.decoding.verify_sampling import verify_sampling

MAX_K = 64
RECALIBRATE_EVERY = 4   # rounds between handing the controller re-calibrated costs


class Engine:
    """Owns the target model's KV cache and the drafters; generates for one request at a time.

    target: a model with the forward contract of speczoo.models (tokens, positions, cache -> logits).
    cache:  the target's KV cache (preallocated; capacity >= max_seq + MAX_K + 1).
    drafters: name -> factory of a Drafter (built per request: "ngram", "draft", ...).
    costs:  measured costs (target c_v curve, draft cost per token) for the per-round controller; with
            their step_ms known, greedy requests re-calibrate them from this engine's own timings as they
            run (decoding/calibrate.py), across requests; seeded sampled requests keep them as loaded.
    auto_excludes: drafters the "auto" mode does not offer the controller.
    """

    def __init__(self, target, cache, tokenizer, drafters: dict[str, Callable[[GenerationRequest], Drafter]],
                 eos_ids: list[int], max_seq: int, costs: Costs | None = None,
                 auto_excludes: frozenset[str] = frozenset()):
        self.target = target
        self.cache = cache
        self.tokenizer = tokenizer
        self.drafters = drafters
        self.eos = set(eos_ids)
        self.max_seq = max_seq
        self.costs = costs            # measured c_v curve and draft costs for the controller
        self._meter: CostMeter | None = None
        self.auto_excludes = auto_excludes   # drafters "auto" leaves out (still usable by name)

    @property
    def meter(self) -> CostMeter | None:
        """The online calibration of `costs` (None without costs or their step_ms); it starts afresh
        when `costs` is replaced."""
        if self.costs is None or self.costs.step_ms is None:
            return None
        if self._meter is None or self._meter.profile is not self.costs:
            self._meter = CostMeter(self.costs)
        return self._meter

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
        self._drafter_names(req.spec)
        need = len(req.prompt_ids) + req.max_new_tokens
        if need > self.max_seq:
            raise CacheFullError(
                f"prompt ({len(req.prompt_ids)} tokens) + max_new_tokens ({req.max_new_tokens}) = {need} "
                f"exceeds the context of {self.max_seq} tokens: shorten the prompt, lower max_new_tokens, "
                f"or raise --max-seq")

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
        return self.target(tokens, positions, self.cache, hidden_layers=layers, logit_rows=logit_rows)

    def score(self, ids: list[int]) -> torch.Tensor:
        """The target's logits [V] for the token after `ids` (a fresh prefill; for diagnostics)."""
        self.cache.reset()
        logits = self._forward(ids)[-1]
        self.cache.reset()
        return logits

    # -- the loop ---------------------------------------------------------------------------
    def generate(self, req: GenerationRequest) -> Iterator[TokenEvent | DoneEvent]:
        """Validate the request now (errors raise before any event), then stream its events."""
        self._check(req)
        return self._run(req)

    def _run(self, req: GenerationRequest) -> Iterator[TokenEvent | DoneEvent]:
        greedy = req.sampling.greedy
        gen = None if greedy else sampling.make_generator(req.sampling.seed)
        drafters: dict[str, Drafter] = {}
        names = self._drafter_names(req.spec)
        for name in names:
            drafters[name] = self.drafters[name](req)
        # Calibrated costs make the controller's choices depend on timing. Greedy output cannot change
        # with them; a sampled text would (which draft tokens meet which random numbers), so a request
        # that sampled with a seed decides on the loaded profile alone and reproduces its text run after run.
        meter = self.meter if greedy or req.sampling.seed is None else None
        policy = make_policy(req, drafters, meter.costs() if meter is not None else self.costs)
        taps = FeatureTaps(drafters.values())          # target hidden states the drafters read (EAGLE)
        stream = TextStream(self.tokenizer, req.stop)
        stats = Stats(prompt_tokens=len(req.prompt_ids), drafter=req.spec)

        self.cache.reset()
        t0 = time.perf_counter()
        fwd = self._forward_out(req.prompt_ids, taps.layers, logit_rows=slice(-1, None))  # the last row's logits
        logits = fwd.logits[-1:]                                         # [1, V]
        pending = self._pick(logits, req, gen)[0]
        taps.send(fwd.hidden)                  # the prompt's features first: a head ingests them in prefill
        for d in drafters.values():
            d.prefill(req.prompt_ids)
        t1 = time.perf_counter()
        stats.prefill_seconds = t1 - t0
        context = list(req.prompt_ids)
        out: list[int] = []
        finish = "length"
        try:
            while True:
                remaining = req.max_new_tokens - len(out)
                if pending in self.eos:
                    finish = "stop"
                    break
                ctx = context + [pending]
                choice = None
                if remaining > 1:
                    lags = {name: d.lag(ctx) for name, d in drafters.items()}
                    choice = policy.choose(lags, {name: d.situation(ctx) for name, d in drafters.items()})
                drafting = choice is not None and choice.drafting
                draft = Draft(tokens=[])
                if drafting:
                    k = min(choice.k, remaining - 1)
                    t_draft = time.perf_counter()
                    draft = head(drafters[choice.drafter].propose(ctx, k, choice.floors), k)
                    if meter is not None and lags[choice.drafter] <= 2:   # in step: no catch-up
                        meter.draft(choice.drafter, draft.k if draft.work is None else draft.work,
                                    time.perf_counter() - t_draft)
                if remaining == 1:
                    new = [pending]
                    accepted = 0
                else:
                    t_verify = time.perf_counter()
                    if is_chain(draft.parents):
                        base = self.cache.length
                        fwd = self._forward_out([pending] + draft.tokens, taps.layers)
                        logits = fwd.logits                                 # [K+1, V]
                        if greedy:
                            verdict = verify_greedy(draft, logits.argmax(-1).tolist())
                        else:
                            verdict = verify_sampling(draft, sampling.probs(logits, req.sampling), gen)
                        accepted = verdict.accepted
                        self.cache.truncate(base + 1 + accepted)
                        taps.send(fwd.hidden, slice(0, 1 + accepted))
                        new = [pending] + draft.tokens[:accepted]
                        if drafting:
                            drafters[choice.drafter].commit(accepted)
                            policy.update(choice.drafter, draft.k, accepted)
                    else:                                                   # a token tree (drafting)
                        verdict, judged = self._verify_tree(pending, draft, req, gen, taps)
                        accepted = verdict.accepted
                        new = [pending] + [draft.tokens[i] for i in verdict.path]
                        drafters[choice.drafter].commit_path(verdict.path)
                        policy.update(choice.drafter, judged, accepted)
                    if meter is not None:
                        meter.forward(1 + draft.k, time.perf_counter() - t_verify)
                        if stats.rounds % RECALIBRATE_EVERY == 0:
                            policy.use_costs(meter.costs())
                    stats.rounds += 1
                    stats.drafted += draft.k
                    stats.accepted += accepted
                    pending = verdict.next_token
                # EOS inside the accepted run ends generation there.
                for i, t in enumerate(new):
                    if t in self.eos:
                        new = new[:i]
                        finish = "stop"
                        break
                out.extend(new)
                context.extend(new)
                text = stream.push(new)
                if stream.stopped:
                    finish = "stop"
                if new or text:
                    yield TokenEvent(ids=new, text=text, drafted=draft.k, accepted=accepted,
                                     drafter=choice.drafter if drafting else "none")
                if finish == "stop" or len(out) >= req.max_new_tokens:
                    break
        finally:
            stats.seconds = time.perf_counter() - t1
            stats.new_tokens = len(out)
        tail = stream.flush()
        if tail:
            yield TokenEvent(ids=[], text=tail)
        yield DoneEvent(finish_reason=finish, text=stream.text, ids=out, stats=stats)

    def _verify_tree(self, pending: int, draft: Draft, req: GenerationRequest, gen,
                     taps: FeatureTaps = FeatureTaps(())) -> tuple[Verdict, int]:
        """One target forward over [a0] + the tree's N nodes (tree mask, tree positions), the tree verify,
        then the accepted path's K/V moved next to the prefix. Returns the verdict and how many draft
        tokens the target judged along its path (for the controller's acceptance estimate)."""
        layout = TreeLayout.from_parents(draft.parents)
        base = self.cache.length
        tokens = torch.tensor([pending] + draft.tokens, dtype=torch.long)          # [N+1]
        fwd = self.target(tokens, layout.positions(base), self.cache, tree_mask=layout.mask,
                          hidden_layers=taps.layers)
        logits = fwd.logits                                                         # [N+1, V]
        if req.sampling.greedy:
            verdict = verify_tree_greedy(draft, layout, logits.argmax(-1).tolist())
        else:
            verdict = verify_tree_sampling(draft, layout, sampling.probs(logits, req.sampling), gen)
        self.cache.compact([base + 1 + i for i in verdict.path], base + 1)
        self.cache.truncate(base + 1 + verdict.accepted)
        taps.send(fwd.hidden, torch.tensor([0] + [1 + i for i in verdict.path]))
        return verdict, layout.judged(verdict.path)

    def _pick(self, logits: torch.Tensor, req: GenerationRequest, gen) -> list[int]:
        return sampling.pick(logits, req.sampling, gen).tolist()

    def _drafter_names(self, spec: str) -> list[str]:
        """Which drafters a spec mode may use: "off" none; "auto" every one available but auto_excludes."""
        if spec == "off":
            return []
        if spec == "auto":
            return [name for name in self.drafters if name not in self.auto_excludes]
        name = spec.split(":", 1)[0]
        if name not in self.drafters:
            raise ValueError(f"speculative mode {spec!r} is not available here; choose one of "
                             f"{['off', 'auto', *self.drafters]}")
        return [name]
