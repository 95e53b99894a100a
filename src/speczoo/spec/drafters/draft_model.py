"""The draft-model drafter: a small model of the same tokenizer proposes K tokens autoregressively.

It owns its model's KV cache and keeps it in step with the committed sequence: before each proposal
it keeps the longest prefix of what it has fed that the committed context still agrees with (its
accepted draft tokens), drops the rest in O(1), and feeds only the new tail — the correction or bonus
token the target added, which the draft has not seen yet. It never touches the target's cache.
Greedy proposals return no probabilities; under sampling it returns q [K, V] for the verify rule.
It stops on its own confidence (`floors`, set by the controller): once the product of the
probabilities it gave its tokens (the argmax's softmax probability, or q of the sampled token) falls
below the floor, one more draft step is unlikely to pay. The stop depends on the draft alone, so the
verify rules stay exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from speczoo import sampling
from speczoo.events import GenerationRequest, SamplingParams
from speczoo.spec.drafters.base import Drafter
from speczoo.spec.drafters.draft_head import ReducedHead
from speczoo.spec.types import Draft

DRAFT_HEAD_VOCAB = 32768   # ids the draft proposes from (plus the prompt's own); see draft_head.py


def agreeing_prefix(fed: list[int], context: list[int], hint: int = 0) -> int:
    """Length of the longest prefix of `fed` (ids in a draft cache) that `context` agrees with, at most
    all but the last context id (always re-fed for its logits). hint: a length known to have agreed
    with an earlier, shorter context; the scan starts there unless the context is another one."""
    limit = min(len(fed), len(context) - 1)
    n = min(hint, limit)
    if fed[:n] != context[:n]:                          # a new context (not a continuation): rescan
        n = 0
    while n < limit and fed[n] == context[n]:
        n += 1
    return n


class DraftModelDrafter(Drafter):
    name = "draft"
    stops_on_confidence = True

    def __init__(self, model, cache, params: SamplingParams | None = None,
                 generator: torch.Generator | None = None, head: ReducedHead | None = None):
        self.model = model
        self.cache = cache
        self.head = head                  # a reduced-vocabulary head for proposals (None: the model's own)
        self.params = params or SamplingParams()
        self.generator = generator
        self.fed: list[int] = []          # ids whose K/V sit in the draft cache, in order
        self._agreed = 0                  # fed[:_agreed] agreed with the context at the last sync
        self.forwards = 0

    def reset(self) -> None:
        self.cache.reset()
        self.fed = []
        self._agreed = 0

    def _forward(self, ids: list[int]) -> torch.Tensor:  # -> logits [R, V]; R = 1 (the last id) for real models
        start = self.cache.length
        tokens = torch.tensor(ids, dtype=torch.long)
        positions = torch.arange(start, start + len(ids), dtype=torch.long)
        self.fed.extend(ids)
        self.forwards += 1
        return self.model(tokens, positions, self.cache, logit_rows=slice(-1, None), head=self.head).logits

    def _agreeing(self, context: list[int]) -> int:
        """Within a request the context only grows, so the scan starts where the last sync left off."""
        return agreeing_prefix(self.fed, context, self._agreed)

    def _sync(self, context: list[int]) -> list[int]:
        """Roll the cache back to the agreeing prefix; return the ids still to feed (never empty)."""
        n = self._agreeing(context)
        self.cache.truncate(n)
        del self.fed[n:]
        self._agreed = n
        return context[n:]

    def lag(self, context: list[int]) -> int:
        """Ids to feed before proposing after `context`, beyond its last one."""
        return len(context) - 1 - self._agreeing(context) if context else 0

    def prefill(self, prompt: list[int]) -> None:
        """Fill the draft cache with the prompt (the next proposal re-feeds only its last id)."""
        if self.head is not None:
            self.head.keep(prompt)         # the prompt's rarer ids stay proposable
        rest = self._sync(prompt)          # ids not in the cache yet; always ends with the last prompt id
        if len(rest) > 1:
            self._forward(rest[:-1])

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        if not context:
            raise ValueError("the draft model needs at least one context token")
        logits = self._forward(self._sync(context))[-1:]               # [1, V]
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        sure = 1.0                          # product of the probabilities given to the tokens so far
        for i in range(k):
            if self.params.greedy and self.head is not None:          # argmax among the ids it scores
                t, kept = self.head.pick(logits[0])
                if i < len(floors):
                    sure *= float(torch.softmax(kept, -1).max())
            elif self.params.greedy:
                t = int(logits[0].argmax())
                if i < len(floors):
                    sure *= float(torch.softmax(logits[0], -1)[t])
            else:
                q = sampling.probs(logits, self.params)                 # [1, V]
                t = int(sampling.sample(q, self.generator)[0])
                qs.append(q[0])
                sure *= float(q[0, t])
            tokens.append(t)
            if i + 1 < k and i < len(floors) and sure < floors[i]:
                break
            if i + 1 < k:
                logits = self._forward([t])
        probs = torch.stack(qs) if qs else None                         # [K, V]
        return Draft(tokens=tokens, probs=probs, drafter=self.name)

    def commit(self, accepted: int) -> None:
        """Nothing to do now: the next `propose` keeps exactly the prefix the target agreed with."""


def make_draft_drafter(draft, target, max_seq: int, head_vocab: int | None = DRAFT_HEAD_VOCAB
                       ) -> Callable[[GenerationRequest], DraftModelDrafter]:
    """A factory the engine calls per request: one draft cache, reused (reset) across requests.

    head_vocab: propose from a reduced head over the first `head_vocab` ids plus the prompt's own
    (draft_head.py) when the draft's LM head is a compiled kernel; None: the full head.
    """
    from speczoo.cache import KVCache
    from speczoo.spec.engine import MAX_K

    if draft.args.vocab_size > target.args.vocab_size:
        raise ValueError(f"draft {draft.name} has a larger vocabulary ({draft.args.vocab_size}) than target "
                         f"{target.name} ({target.args.vocab_size}): not a pair; see `speczoo check-pair`")
    cache = KVCache(draft.args, max_seq, extra=2 * MAX_K + 2)
    head = ReducedHead.for_model(draft.model, head_vocab)

    def factory(req: GenerationRequest) -> DraftModelDrafter:
        gen = None if req.sampling.greedy else sampling.make_generator(
            None if req.sampling.seed is None else req.sampling.seed + 1)
        d = DraftModelDrafter(draft.model, cache, req.sampling, gen, head)
        d.reset()
        return d

    return factory
