"""The draft-model drafter: a small model of the same tokenizer proposes K tokens autoregressively.

It owns its model's KV cache and keeps it in step with the committed sequence: before each proposal
it keeps the longest prefix of what it has fed that the committed context still agrees with (its
accepted draft tokens), drops the rest in O(1), and feeds only the new tail — the correction or bonus
token the target added, which the draft has not seen yet. It never touches the target's cache.
Greedy proposals return no probabilities; under sampling it returns q [K, V] for the verify rule.
It stops on its own confidence (`floors`, set by the controller): once the product of the
probabilities it gave its tokens (the argmax's softmax probability, or q of the sampled token) falls
below the floor, one more draft step is unlikely to pay. The stop depends on the draft alone, so the
verify rules stay exact. Where the text copies itself, a step also takes the ids prompt lookup guesses
the draft will say (guess.py): the same chain in fewer forwards. A draft whose embedding has other row
counts than the target's (padding past one shared tokenizer, decoding/pair.py) works in the target's ids
(SharedVocab): it proposes only ids the target has, and is fed a stand-in for an id it has no row for.
A draft that sat out rounds (prompt lookup copied a long stretch) catches up on the last `window` ids of
what it missed only: the ids before them are skipped, left out of its cache (a hole), and the ids it
feeds keep their true positions. Its proposals may then be a little worse, never the output (the target
verifies every token); its catch-up costs a forward over at most window + 1 rows, however long the copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from speczoo import sampling
from speczoo.models.forward import Readout
from speczoo.request import GenerationRequest, SamplingParams
from speczoo.decoding.pricing.cost import CvCurve
from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.drafters.draft_head import ReducedHead
from speczoo.decoding.drafters.guess import Guesser
from speczoo.decoding.tuning import DRAFTING
from speczoo.decoding.types import Draft


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


def catch_up_ids(missed: int, window: int) -> int:
    """How many of the `missed` ids a draft that sat out rounds feeds before proposing: the last `window`
    of them (0: every one); the ones before are skipped."""
    return min(missed, window) if window else missed


@dataclass(frozen=True)
class SharedVocab:
    """A draft and a target whose embeddings have different row counts over one tokenizer (the rows past
    the ids text produces are padding). The drafter then works in the target's ids: its logits are cut, or
    padded with -inf, to the target's rows, so it proposes (greedy or sampled, q a distribution over the
    target's vocabulary) only ids the target has; an id the target says that the draft has no row for
    (a padding id no text produces) is fed to the draft as STAND_IN, which can only cost acceptance."""

    draft: int     # rows of the draft's embedding and LM head
    target: int    # rows of the target's

    STAND_IN = 0

    def fit(self, logits: torch.Tensor) -> torch.Tensor:  # [R, draft] -> [R, target]
        if self.draft >= self.target:
            return logits[:, : self.target]
        return torch.cat((logits, logits.new_full((logits.shape[0], self.target - self.draft), -torch.inf)), 1)

    def feedable(self, ids: list[int]) -> list[int]:
        return [i if i < self.draft else self.STAND_IN for i in ids]


class DraftModelDrafter(Drafter):
    name = "draft"
    stops_on_confidence = True

    def __init__(self, model, cache, params: SamplingParams | None = None,
                 generator: torch.Generator | None = None, head: ReducedHead | None = None,
                 guesser: Guesser | None = None, vocab: SharedVocab | None = None, window: int = 0):
        if window < 0:
            raise ValueError(f"the catch-up window must be >= 0 (0: feed every missed id), got {window}")
        self.model = model
        self.window = window              # the most missed ids a catch-up feeds (0: all of them)
        self.vocab = vocab                # the draft's and the target's rows when they differ (None: the same)
        self.cache = cache
        self.head = head                  # a reduced-vocabulary head for proposals (None: the model's own)
        self.guesser = guesser            # prompt-lookup guesses fed along with a step (None: none)
        self.params = params or SamplingParams()
        self.generator = generator
        self.fed: list[int] = []          # the context ids the draft cache accounts for, in order
        self.holes: list[tuple[int, int]] = []   # (index in fed, count): skipped ids, with no cache row
        self._agreed = 0                  # fed[:_agreed] agreed with the context at the last sync
        self.forwards = 0

    def reset(self) -> None:
        self.cache.reset()
        self.fed = []
        self.holes = []
        self._agreed = 0
        if self.guesser is not None:
            self.guesser.reset()

    def _forward(self, ids: list[int], rows: int = 1) -> torch.Tensor:  # -> logits [rows, V] of the last rows
        """V: the target's vocabulary (see SharedVocab)."""
        start = len(self.fed)                           # the true position (past a hole: not the slot)
        tokens = torch.tensor(ids if self.vocab is None else self.vocab.feedable(ids), dtype=torch.long)
        positions = torch.arange(start, start + len(ids), dtype=torch.long)
        self.fed.extend(ids)
        self.forwards += 1
        out = self.model(tokens, positions, self.cache, readout=Readout(logit_rows=slice(-rows, None), head=self.head))
        logits = out.logits[-rows:]                     # (a model may give every row; an oracle does)
        return logits if self.vocab is None else self.vocab.fit(logits)

    def _agreeing(self, context: list[int]) -> int:
        """Within a request the context only grows, so the scan starts where the last sync left off."""
        return agreeing_prefix(self.fed, context, self._agreed)

    def _truncate(self, n: int) -> None:
        """Keep what fed[:n] left in the cache (its slots: n less the skipped ids before n)."""
        self.holes = [(at, min(count, n - at)) for at, count in self.holes if at < n]
        self.cache.truncate(n - sum(count for _, count in self.holes))
        del self.fed[n:]

    def _sync(self, context: list[int], window: int = 0) -> list[int]:
        """Roll the cache back to the agreeing prefix; return the ids still to feed (never empty). With a
        `window`, missed ids before the last `window` of them (and the context's last id) are skipped."""
        n = self._agreeing(context)
        self._truncate(n)
        self._agreed = n
        missed = len(context) - 1 - n
        skip = missed - catch_up_ids(missed, window)
        if skip > 0:
            self.holes.append((n, skip))
            self.fed.extend(context[n:n + skip])
            n += skip
        return context[n:]

    def lag(self, context: list[int]) -> int:
        """Ids to feed before proposing after `context`, beyond its last one (at most the window)."""
        return catch_up_ids(len(context) - 1 - self._agreeing(context), self.window) if context else 0

    def prefill(self, prompt: list[int]) -> None:
        """Fill the draft cache with the prompt (the next proposal re-feeds only its last id)."""
        if self.head is not None:
            self.head.keep(prompt)         # the prompt's rarer ids stay proposable
        rest = self._sync(prompt)          # ids not in the cache yet; always ends with the last prompt id
        if len(rest) > 1:
            self._forward(rest[:-1])

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        """The draft's own chain of up to k tokens after `context`. With a guesser, each forward also
        takes the ids prompt lookup guesses the draft will say next: row j of the forward then gives the
        draft's token after the first j guessed ids, valid while the draft agrees with them; the cache
        keeps the agreed ones and drops the rest. Same tokens as one forward per token (the forward is
        batch-invariant), fewer forwards where the text copies itself."""
        if not context:
            raise ValueError("the draft model needs at least one context token")
        if k < 1:
            return Draft(tokens=[], drafter=self.name)
        feed = self._sync(context, self.window)   # ids to feed; ends with the context's last id
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        said: list[float] = []              # the probability given to each token (with floors: all of them)
        sure = 1.0                          # their product so far
        work = 0.0                          # its forwards, each at its cost over its rows (in steps)
        while True:
            guess = self.guesser.guess(context, tokens, k - len(tokens) - 1) if self.guesser else []
            base = len(self.fed) + len(feed)           # where the guessed ids go in fed
            work += self.guesser.rows.wide(len(feed) + len(guess)) if guess else 1.0
            logits = self._forward(feed + guess, 1 + len(guess))           # [1 + G, V]
            for j in range(1 + len(guess)):              # row j: after feed and the first j guessed ids
                t, p = self._pick(logits[j:j + 1], qs, bool(floors))
                tokens.append(t)
                said.append(p)
                sure *= p
                done = len(tokens) == k or (len(tokens) <= len(floors) and sure < floors[len(tokens) - 1])
                if done or j == len(guess) or guess[j] != t:
                    break
            if guess:
                agreed = j < len(guess) and guess[j] == t          # only when the chain ended there
                self.guesser.judge(len(guess), j + agreed, censored=agreed)
            if done:
                return Draft(tokens=tokens, probs=torch.stack(qs) if qs else None, drafter=self.name, work=work,
                             confidences=said if floors else None)
            self._truncate(base + j)                   # rows after a guessed id the draft did not say
            feed = [t]

    def _pick(self, logits: torch.Tensor, qs: list[torch.Tensor], sure: bool) -> tuple[int, float]:
        """The next draft token from one row of logits [1, V] and, when `sure` asks for it (the round has
        confidence floors: the last token's probability is not for a floor but for the controller's fit of
        them, Draft.confidences), the probability it was given (1.0 otherwise); under sampling its q [V] is
        appended to `qs`."""
        if self.params.greedy and self.head is not None:          # argmax among the ids it scores
            t, kept = self.head.pick(logits[0])
            return t, float(torch.softmax(kept, -1).max()) if sure else 1.0
        if self.params.greedy:
            t = int(logits[0].argmax())
            return t, float(torch.softmax(logits[0], -1)[t]) if sure else 1.0
        q = sampling.probs(logits, self.params)                     # [1, V]
        t = int(sampling.sample(q, self.generator)[0])
        qs.append(q[0])
        return t, float(q[0, t])

    def commit(self, accepted: int) -> None:
        """Nothing to do now: the next `propose` keeps exactly the prefix the target agreed with."""


def reduced_head(model, head_vocab: int | None = DRAFTING.head_vocab) -> ReducedHead | None:
    """The reduced LM head `model` proposes from as a draft (draft_head.py: the first `head_vocab` ids
    plus the prompt's own), or None when it keeps its full head (its LM head is not a compiled kernel,
    or head_vocab is None). What the cost profile times a draft step through (pricing/profile.py)."""
    return ReducedHead.for_model(model, head_vocab)


def make_draft_drafter(draft, target, max_seq: int, head_vocab: int | None = DRAFTING.head_vocab,
                       rows: CvCurve | float | None = None, guess_max: int = DRAFTING.guess_max,
                       kv_dtype: torch.dtype = torch.float32, window: int = DRAFTING.catch_up_window
                       ) -> Callable[[GenerationRequest], DraftModelDrafter]:
    """A factory the engine calls per request: one draft cache, reused (reset) across requests.

    draft, target: loaded models (runtime.LoadedModel: .model, .args, .name) of the same tokenizer (their
    row counts may differ by padding: SharedVocab).
    max_seq: the longest sequence a request may reach (prompt + output).
    head_vocab: propose from a reduced head over the first `head_vocab` ids plus the prompt's own
    (draft_head.py) when the draft's LM head is a compiled kernel; None: the full head.
    rows: the draft's forward cost over S rows relative to one (its c_v curve), which sizes the
    prompt-lookup guesses (guess.py); None: no guesses. guess_max: the most guessed ids per forward.
    kv_dtype: the draft cache's element type (the target's, --kv-type).
    window: the most missed ids a catch-up feeds (DraftModelDrafter; 0: all). A draft with sliding-window
    or convolution layers feeds all: their keys and state are found by slot, which a hole would shift.
    """
    from speczoo.cache import KVCache

    sizes = (draft.args.vocab_size, target.args.vocab_size)
    vocab = SharedVocab(*sizes) if sizes[0] != sizes[1] else None
    cache = KVCache(draft.args, max_seq, extra=DRAFTING.draft_cache_margin, dtype=kv_dtype)
    head = reduced_head(draft.model, head_vocab)
    if draft.args.sliding_window > 0 or draft.args.conv_layers:
        window = 0

    def factory(req: GenerationRequest) -> DraftModelDrafter:
        gen = None if req.sampling.greedy else sampling.make_generator(
            None if req.sampling.seed is None else req.sampling.seed + 1)
        guesser = Guesser(rows, guess_max) if rows is not None and guess_max > 0 else None
        d = DraftModelDrafter(draft.model, cache, req.sampling, gen, head, guesser, vocab, window)
        d.reset()
        return d

    return factory
