"""What a caller asks a generation for: the prompt's ids, how many tokens, how to sample, how to speculate.

`GenerationRequest` goes into `Runtime.generate` (and the engine's `open`); the events it streams back
are speczoo/events.py. The CLI, the chat, the server and the benches build these; the engine validates
them (`SamplingParams.validate`, decoding/engine.py). Plain data: never imports anything of speczoo.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """How the target's next token is picked: greedy (temperature 0, the default) or a draw from its
    distribution after temperature, top-k and top-p (speczoo/sampling.py), from a generator seeded with
    `seed` (None: a fresh one, so the text is not reproducible)."""

    temperature: float = 0.0       # 0: greedy
    top_k: int = 0                 # 0: off
    top_p: float = 1.0             # 1.0: off
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI's, over the generated tokens (decoding/penalties.py); 0: off
    frequency_penalty: float = 0.0

    def validate(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature > 100:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass(frozen=True)
class Constraint:
    """A grammar every generated token must keep the output inside (grammar-constrained decoding: the
    target's logits are masked to the tokens the grammar allows, decoding/constraint.py).

    kind:   "json_schema" (source: a JSON Schema as JSON text; '{"type": "object"}' for any JSON object)
            or "lark" (source: a Lark grammar in llguidance's dialect).
    """

    kind: str
    source: str


@dataclass
class GenerationRequest:
    """One generation: continue `prompt_ids` by up to `max_new_tokens` ids, stopping at an end id or a stop
    string, with the speculative mode `spec` (decoding/modes.py) drafting up to `k` tokens a round, inside
    the grammar `constraint` when one is given."""

    prompt_ids: list[int]
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)   # stop strings (EOS always stops)
    spec: str = "off"               # a speculative mode: "off", "auto", a drafter's name, or MODE:NAME
    k: int = 8                      # max draft tokens per round
    ngram: int = 3                  # max n-gram order for prompt lookup
    logprobs: int | None = None     # None: none computed; N >= 0: each emitted token's log-probability
                                    # and the N most likely alternatives of its row (events.TokenLogprob)
    tenant: str | None = None       # whose earlier answers the suffix drafter may read (the API key; None: no key)
    constraint: Constraint | None = None   # a grammar the output must match (None: free text)
