"""A draft model at a known acceptance: the measured speedup of a target with a draft whose forwards are real
but whose proposals are accepted at a set rate, beside the cost model's prediction. For models with random
weights (benchmarks/shape_models.py), whose own acceptance is ~0, so that r and c_v can be judged at scale.

    python -m benchmarks.forced_draft TARGET DRAFT [--k 4] [--alpha 0.7] [--gen 64] [--threads 2] [--runs 2]
                                      [--prompt TEXT] [--seed 0] [--max-seq 1024] [--json]

TARGET and DRAFT are zoo names or GGUF paths (pulled on first use, as `speczoo bench` does). One runtime loads
both (the pair's first-token gate waived: random weights never pass it; the tokenizer checks still apply),
then alternately, --runs times each:
* greedy: `spec off`, --gen tokens of the raw prompt; its ids are the truth and its time the baseline;
* forced: K = --k draft tokens every round, no controller: the draft model runs exactly the forwards a real
  chain of K costs (its cache synced to the committed ids, then K one-token forwards through its proposing
  head), but the tokens it proposes are the truth's next ones while a seeded coin of probability α says yes,
  then wrong ids: each round keeps L tokens with P(L >= i) = α^i, as the cost model assumes. The output must
  equal greedy token for token (it is checked), so the run is a real speculative run at acceptance α.
Timed inside the forced run: the draft forwards (r = a draft step over the greedy step) and the verify
forwards (c_v(K+1) over the greedy step). Printed: measured speedup (median tok/s over median tok/s); the
cost model's prediction `E / (K·r + c_v(K+1) + overhead)` at the run's realized E (tokens per round), once with
the runtime's priced costs (its stored profile: what `auto` and `draft` decide with) and once with the r and
c_v(K+1) timed in this run (the rest of a round's time is then its overhead). With --json, one JSON line.
A measurement script: never imported by the package; every time depends on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from speczoo.decoding.controller import Choice
from speczoo.decoding.drafters.base import Drafter
from speczoo.decoding.pricing.cost import expected_tokens, round_cost
from speczoo.decoding.types import Draft

PROMPT = ("Write a Python function that parses a CSV file of orders and returns the total per customer, "
          "then explain how it handles quoted fields.")


def forced_length(coin: random.Random, alpha: float, k: int) -> int:
    """How many of K draft tokens a round keeps: each next one with probability α, up to the first no."""
    n = 0
    while n < k and coin.random() < alpha:
        n += 1
    return n


class FixedK:
    """The policy of a forced run: the draft model, K tokens every round, no floors; learns nothing."""

    def __init__(self, drafter: str, k: int):
        self.choice = Choice(drafter, k)

    def choose(self, lags, situations) -> Choice:
        return self.choice

    def update(self, drafter: str, judged: int, accepted: int, nodes: int = 0, path=(), confidences=None) -> None:
        pass

    def use_costs(self, costs) -> None:
        pass


class ForcedDraft(Drafter):
    """A draft model drafter (decoding/drafters/draft_model.py) whose forwards run as they would, proposing
    the truth's next ids while a coin of probability α says yes, then wrong ones; its forwards' time is kept.

    inner: the real DraftModelDrafter (its model, cache and proposing head); truth: the target's greedy ids
    after the prompt of `prompt_len` ids; vocab: the target's, for a wrong id."""

    name = "draft"

    def __init__(self, inner, truth: list[int], prompt_len: int, alpha: float, seed: int, vocab: int):
        self.inner, self.truth, self.prompt_len, self.vocab = inner, truth, prompt_len, vocab
        self.alpha, self.coin = alpha, random.Random(seed)
        self.seconds, self.forwards = 0.0, 0

    def reset(self) -> None:
        self.inner.reset()

    def prefill(self, prompt: list[int]) -> None:
        self.inner.prefill(prompt)

    def lag(self, context: list[int]) -> int:
        return self.inner.lag(context)

    def propose(self, context: list[int], k: int, floors: Sequence[float] = ()) -> Draft:
        # context = prompt + output + [a0]: the draft's first token is truth[at]
        at = len(context) - self.prompt_len
        keep = forced_length(self.coin, self.alpha, k)
        tokens = [self.truth[at + i] if i < keep else (self.truth[at + i] + 1) % self.vocab for i in range(k)]
        t = time.perf_counter()
        feed = self.inner._sync(context)
        for i in range(k):                          # the K forwards of a real chain; the forced ids are fed
            logits = self.inner._forward(feed)
            self.inner._pick(logits[-1:], [], False)
            feed = [tokens[i]]
        self.seconds += time.perf_counter() - t
        self.forwards += k
        return Draft(tokens=tokens, drafter=self.name)

    def commit(self, accepted: int) -> None:
        self.inner.commit(accepted)


@dataclass
class ForcedRun:
    """The figures of one forced run (times in seconds)."""
    tok_s: float
    tokens: int
    rounds: int
    drafted: int
    accepted: int
    seconds: float
    draft_seconds: float
    draft_forwards: int
    verify_seconds: float
    verifies: int
    lossless: bool


@contextmanager
def gate_waived() -> Iterator[None]:
    """Within it, check_pair lets a pair through its first-token gate (random weights never agree on a probe's
    next token); every other check (tokenizer, vocabulary, special ids) still refuses a bad pair."""
    from speczoo.decoding import pair

    checked = pair.check_pair

    def without_the_gate(draft, target) -> pair.PairReport:
        report = checked(draft, target)
        if report.gate_only:
            report.ok, report.problems = True, []
        return report

    pair.check_pair = without_the_gate
    try:
        yield
    finally:
        pair.check_pair = checked


def greedy_run(rt, ids: list[int], gen: int) -> tuple[list[int], float]:
    """The target alone: its ids and decode tok/s (after the prefill)."""
    from speczoo.bench.ab import run_request
    from speczoo.request import GenerationRequest

    done = run_request(rt, GenerationRequest(prompt_ids=ids, max_new_tokens=gen, spec="off"))
    return done.ids, done.stats.tok_s


def forced_run(rt, ids: list[int], truth: list[int], k: int, alpha: float, seed: int) -> ForcedRun:
    """A speculative run of rt's draft model at K tokens a round, accepted at α (see ForcedDraft)."""
    from speczoo.request import GenerationRequest

    engine = rt.engine
    g = engine.open(GenerationRequest(prompt_ids=ids, max_new_tokens=len(truth), spec="draft", k=k))
    forced = ForcedDraft(g.drafters["draft"], truth, len(ids), alpha, seed, rt.vocab_size)
    g.drafters, g.policy, g.meter = {"draft": forced}, FixedK("draft", k), None
    timed = {"s": 0.0, "n": 0}
    verify = engine._verify

    def timed_verify(gen, plan):
        t = time.perf_counter()
        out = verify(gen, plan)
        timed["s"] += time.perf_counter() - t
        timed["n"] += 1
        return out

    engine._verify = timed_verify
    try:
        for _ in engine.rounds(g):
            pass
    finally:
        del engine._verify
    s = g.stats
    return ForcedRun(len(g.out) / s.seconds, len(g.out), s.rounds, s.drafted, s.accepted, s.seconds, forced.seconds,
                     forced.forwards, timed["s"], timed["n"], g.out == truth)


def prediction(e: float, k: int, r: float, cv_k1: float, overhead: float) -> float:
    """The cost model's speedup at E tokens a round: E / (K·r + c_v(K+1) + overhead)."""
    return e / round_cost(k, cv_k1, r, overhead)


def measure(target: str, draft: str, k: int, alpha: float, gen: int, runs: int, prompt: str, seed: int,
            log=print, max_seq: int = 1024) -> dict:
    """The forced runs and greedy runs alternated (see the module docstring); max_seq sizes both KV caches
    (the model's own context would reserve gigabytes an 8B's short run never touches)."""
    from speczoo.runtime import load_runtime

    with gate_waived():
        rt = load_runtime(target, draft=draft, max_seq=max_seq)
    ids = rt.tokenizer.encode(prompt)
    costs = rt.engine.costs
    truth, _ = greedy_run(rt, ids, gen)                               # the truth; warms both sides up
    forced_run(rt, ids, truth[:8], k, alpha, seed)
    greedy, forced, same = [], [], True
    for i in range(runs):
        for side in ("greedy", "forced") if i % 2 == 0 else ("forced", "greedy"):
            if side == "greedy":
                out, tok_s = greedy_run(rt, ids, gen)
                same = same and out == truth
                greedy.append(tok_s)
                log(f"greedy: {tok_s:.2f} tok/s")
            else:
                run = forced_run(rt, ids, truth, k, alpha, seed + i)
                forced.append(run)
                log(f"forced K={k} α={alpha}: {run.tok_s:.2f} tok/s, {run.tokens / run.rounds:.2f} tokens a round, "
                    f"equal to greedy: {run.lossless}")
    step = 1.0 / statistics.median(greedy)                        # seconds of a greedy step (decode)
    runs_ = forced
    e = 1.0 + statistics.mean(x.accepted / x.rounds for x in runs_)      # a0 + the accepted drafts
    r_run = statistics.mean(x.draft_seconds / x.draft_forwards for x in runs_) / step
    cv_run = statistics.mean(x.verify_seconds / x.verifies for x in runs_) / step
    round_s = statistics.mean(x.seconds / x.rounds for x in runs_) / step
    overhead_run = max(0.0, round_s - k * r_run - cv_run)
    r_priced, cv_priced = costs.draft_cost["draft"], costs.cv(k + 1)
    measured = statistics.median(x.tok_s for x in runs_) / statistics.median(greedy)
    return {"k": k, "alpha": alpha, "gen": gen, "runs": runs, "greedy_tok_s": statistics.median(greedy),
            "forced_tok_s": statistics.median(x.tok_s for x in runs_), "measured": measured,
            "tokens_per_round": e, "expected_tokens": expected_tokens(alpha, k),
            "lossless": same and all(x.lossless for x in runs_),
            "priced": {"r": r_priced, "cv_k1": cv_priced, "overhead": costs.round_overhead, "step_ms": costs.step_ms,
                       "predicted": prediction(e, k, r_priced, cv_priced, costs.round_overhead)},
            "in_run": {"r": r_run, "cv_k1": cv_run, "overhead": overhead_run, "step_ms": step * 1e3,
                       "predicted": prediction(e, k, r_run, cv_run, overhead_run)},
            "runs_detail": [asdict(x) for x in runs_]}


def report(m: dict) -> str:
    """A markdown table of one measurement: the cost model's prediction (priced, in-run) beside the run."""
    p, q = m["priced"], m["in_run"]
    lines = [f"| r, c_v from | r = draft step / target step | c_v({m['k'] + 1}) | overhead | predicted speedup | "
             f"measured speedup |", "|---|---|---|---|---|---|",
             f"| the runtime's profile | {p['r']:.3f} | {p['cv_k1']:.2f} | {p['overhead']:.3f} | {p['predicted']:.2f}× | "
             f"{m['measured']:.2f}× |",
             f"| timed in this run | {q['r']:.3f} | {q['cv_k1']:.2f} | {q['overhead']:.3f} | {q['predicted']:.2f}× | "
             f"{m['measured']:.2f}× |", "",
             f"K = {m['k']}, α = {m['alpha']} forced: {m['tokens_per_round']:.2f} tokens a round (E(α, K) = "
             f"{m['expected_tokens']:.2f}); greedy {m['greedy_tok_s']:.2f} tok/s (step {q['step_ms']:.1f} ms), with the "
             f"draft {m['forced_tok_s']:.2f} tok/s; output equal to greedy: {'yes' if m['lossless'] else 'NO'}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("target")
    p.add_argument("draft")
    p.add_argument("--k", type=int, default=4, help="draft tokens every round (default 4)")
    p.add_argument("--alpha", type=float, default=0.7, help="the forced acceptance per token (default 0.7)")
    p.add_argument("--gen", type=int, default=64, help="tokens per run (default 64)")
    p.add_argument("--runs", type=int, default=2, help="runs of each side, alternated (default 2)")
    p.add_argument("--threads", type=int, default=None, help="a fixed thread count (default: as the CLI's)")
    p.add_argument("--prompt", default=PROMPT, help="raw prompt text")
    p.add_argument("--seed", type=int, default=0, help="the acceptance coin's seed")
    p.add_argument("--max-seq", type=int, default=1024, help="both KV caches' length (default 1024)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    a = p.parse_args(argv)
    if not 0.0 <= a.alpha <= 1.0 or a.k < 1 or a.gen < 2 or a.runs < 1:
        p.error("--alpha must be in [0, 1], --k and --runs >= 1, --gen >= 2")
    from speczoo.threads import apply_threads
    apply_threads(a.threads)
    log = lambda line: print(line, file=sys.stderr, flush=True)   # noqa: E731
    m = measure(a.target, a.draft, a.k, a.alpha, a.gen, a.runs, a.prompt, a.seed, log, a.max_seq)
    print(json.dumps(m) if a.json else report(m))
    return 0 if m["lossless"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
