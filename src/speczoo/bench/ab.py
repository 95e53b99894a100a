"""The A/B bench: plain greedy vs speculative on the same prompt, same engine, run alternately.

Prints two lines scripts can grep:
  SPEC LOSSLESS <matching>/<total> PASS|FAIL      (greedy; when sampling: SPEC LOSSLESS n/a ..., see below)
  SPEC STATS greedy=<x> tok/s spec=<y> tok/s speedup=<y/x>x accepted/round=<a> forwards=<f>
tok/s counts decode time only (after the prompt's prefill), the median over --runs of each side;
the speedup is the ratio of the two medians. On FAIL it names the first diverging position and the
target's top-2 logit gap there, so an arithmetic near-tie is told apart from an indexing bug.
When sampling (temperature > 0) the two sides' texts differ by design; the line says so instead of
reporting a token match, and whether each side reproduced itself from its seed across runs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from speczoo.decoding.prompt_checks import check_ids
from speczoo.events import DoneEvent
from speczoo.request import GenerationRequest, SamplingParams

NEAR_TIE_GAP = 0.05     # top-2 logit gap below which a flip can come from rounding alone


@dataclass
class Divergence:
    position: int
    greedy_token: int
    spec_token: int
    gap: float          # target's top-2 logit gap at that position (fresh prefill)

    @property
    def near_tie(self) -> bool:
        return self.gap < NEAR_TIE_GAP

    def describe(self) -> str:
        kind = ("a near-tie: an arithmetic flip, not a bug" if self.near_tie
                else "NOT a near-tie: this is a bug in the speculative path")
        return (f"first divergence at output position {self.position}: greedy {self.greedy_token} vs spec "
                f"{self.spec_token}; top-2 logit gap there {self.gap:.4g} -> {kind}")


@dataclass
class ABResult:
    greedy_ids: list[int]
    spec_ids: list[int]
    greedy_tok_s: list[float] = field(default_factory=list)
    spec_tok_s: list[float] = field(default_factory=list)
    accepted_per_round: float = 0.0
    forwards: int = 0
    divergence: Divergence | None = None
    lossless_runs: bool = True      # every run of each side produced the same ids
    sampled: bool = False           # temperature > 0: the sides draw different random numbers

    @property
    def matching(self) -> int:
        n = 0
        for a, b in zip(self.greedy_ids, self.spec_ids):
            if a != b:
                break
            n += 1
        return n

    @property
    def lossless(self) -> bool:
        return self.greedy_ids == self.spec_ids and self.lossless_runs

    @property
    def speedup(self) -> float:
        g = statistics.median(self.greedy_tok_s)
        return statistics.median(self.spec_tok_s) / g if g else 0.0

    def lines(self) -> list[str]:
        if self.sampled:
            head = (f"SPEC LOSSLESS n/a when sampling: plain and speculative runs draw different random "
                    f"numbers, so their texts differ by design; lossless sampling is a property of the "
                    f"distribution, proven by the chi-square tests (tests/decoding/test_engine_sampling.py). "
                    f"Each side reproducible from its seed across runs: "
                    f"{'yes' if self.lossless_runs else 'NO'}")
        else:
            head = f"SPEC LOSSLESS {self.matching}/{len(self.greedy_ids)} {'PASS' if self.lossless else 'FAIL'}"
        out = [head,
               f"SPEC STATS greedy={statistics.median(self.greedy_tok_s):.2f} tok/s "
               f"spec={statistics.median(self.spec_tok_s):.2f} tok/s speedup={self.speedup:.2f}x "
               f"accepted/round={self.accepted_per_round:.2f} forwards={self.forwards}"]
        if self.divergence is not None:
            out.append("SPEC DIVERGENCE " + self.divergence.describe())
        return out


def run_request(runtime, req: GenerationRequest) -> DoneEvent:
    """Run one request to its end; its DoneEvent."""
    done = None
    for ev in runtime.generate(req):
        done = ev
    assert isinstance(done, DoneEvent)
    return done


def run_ab(runtime, prompt_ids: list[int], spec: str, k: int = 8, ngram: int = 3, gen: int = 96,
           runs: int = 3, sampling: SamplingParams | None = None, warmup: bool = True) -> ABResult:
    """Alternate greedy and speculative runs (`runs` of each); compare ids and time both."""
    if runs < 1:
        raise ValueError(f"--runs must be >= 1, got {runs}")
    sampling = sampling or SamplingParams()
    base = GenerationRequest(prompt_ids=prompt_ids, max_new_tokens=gen, sampling=sampling, k=k, ngram=ngram)
    plain = GenerationRequest(**{**base.__dict__, "spec": "off"})
    fast = GenerationRequest(**{**base.__dict__, "spec": spec})
    if warmup:
        run_request(runtime, GenerationRequest(**{**fast.__dict__, "max_new_tokens": min(8, gen)}))
    result: ABResult | None = None
    for r in range(runs):
        order = [plain, fast] if r % 2 == 0 else [fast, plain]
        done = {id(req): run_request(runtime, req) for req in order}
        g, s = done[id(plain)], done[id(fast)]
        if result is None:
            result = ABResult(greedy_ids=g.ids, spec_ids=s.ids, sampled=not sampling.greedy)
        elif g.ids != result.greedy_ids or s.ids != result.spec_ids:
            result.lossless_runs = False
        result.greedy_tok_s.append(g.stats.tok_s)
        result.spec_tok_s.append(s.stats.tok_s)
        result.accepted_per_round = s.stats.accepted_per_round
        result.forwards = s.stats.rounds
    if result.greedy_ids != result.spec_ids and sampling.greedy:
        pos = result.matching
        logits = runtime.engine.score(prompt_ids + result.greedy_ids[:pos])
        top2 = logits.topk(2).values
        spec_tok = result.spec_ids[pos] if pos < len(result.spec_ids) else -1
        greedy_tok = result.greedy_ids[pos] if pos < len(result.greedy_ids) else -1
        result.divergence = Divergence(pos, greedy_tok, spec_tok, float(top2[0] - top2[1]))
    return result


def read_prompt_ids(path: str, vocab_size: int, model: str = "the target") -> list[int]:
    """Read whitespace-separated token ids (as `speczoo tokenize` writes them); validate them against
    `model`'s vocabulary of `vocab_size` tokens."""
    with open(path, encoding="utf-8") as f:
        words = f.read().split()
    ids = []
    for i, w in enumerate(words):
        try:
            ids.append(int(w))
        except ValueError:
            raise ValueError(f"{path}: item {i + 1} is {w!r}, not a token id; the file must hold "
                             f"whitespace-separated integers (see `speczoo tokenize`)") from None
    if not ids:
        raise ValueError(f"{path}: no token ids in the file")
    try:
        check_ids(ids, vocab_size, model)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return ids
