"""The generation API that the CLI, the chat, the server and the benches consume.

`Runtime.generate(request)` (speczoo/textgen.py over the engine's rounds) yields `TokenEvent`s as
rounds finish and one final `DoneEvent`.
Consumers only read these; they never touch models or caches. Closing the generator (a client that
disconnects) ends the generation and frees its state.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    temperature: float = 0.0       # 0: greedy
    top_k: int = 0                 # 0: off
    top_p: float = 1.0             # 1.0: off
    seed: int | None = None

    def validate(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature > 100:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)   # stop strings (EOS always stops)
    spec: str = "off"               # "off" | "ngram" | "draft" | "draft:NAME" | "auto" | "eagle:NAME"
    k: int = 8                      # max draft tokens per round
    ngram: int = 3                  # max n-gram order for prompt lookup


@dataclass
class TokenEvent:
    """One round's output: the new token ids and the text they complete (UTF-8 safe)."""

    ids: list[int]
    text: str
    drafted: int = 0                # draft tokens proposed this round
    accepted: int = 0               # of which accepted
    drafter: str = ""               # the drafter the controller chose this round ("" or "none": plain)


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
