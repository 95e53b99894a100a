"""What a generation streams back: the events that the CLI, the chat, the server and the benches consume.

`Runtime.generate(request)` (a GenerationRequest, speczoo/request.py; speczoo/textgen.py over the
engine's rounds) yields `TokenEvent`s as rounds finish and one final `DoneEvent` with its `Stats`.
Consumers only read these; they never touch models or caches. Closing the generator (a client that
disconnects) ends the generation and frees its state. Plain data: never imports anything of speczoo.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """An emitted token's log-probability under the target's raw distribution (log_softmax of the
    verified logits row that chose it, before temperature, top-k or top-p), and the `top` most likely
    ids of that row with theirs, most likely first (empty when no alternatives were asked for)."""

    id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class TokenEvent:
    """One round's output: the new token ids and the text they complete (UTF-8 safe)."""

    ids: list[int]
    text: str
    drafted: int = 0                # draft tokens proposed this round
    accepted: int = 0               # of which accepted
    drafter: str = ""               # the drafter the controller chose this round ("" or "none": plain)
    logprobs: list[TokenLogprob] | None = None     # one per id, when the request asked (GenerationRequest.logprobs)


@dataclass
class Stats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0            # wall time of the decode phase (after prefill)
    prefill_seconds: float = 0.0
    rounds: int = 0                 # target forwards after prefill
    drafted: int = 0
    accepted: int = 0
    drafter: str = "off"

    @property
    def tok_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def accepted_per_round(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0


@dataclass
class DoneEvent:
    finish_reason: str              # "stop" (EOS or stop string) | "length"
    text: str                       # the whole generated text
    ids: list[int]
    stats: Stats
    logprobs: list[TokenLogprob] | None = None     # one per id, when the request asked
