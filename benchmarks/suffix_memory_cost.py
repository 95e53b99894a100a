"""What the suffix drafter's memory costs per round and per answer, as it fills up to its cap.

    python -m benchmarks.suffix_memory_cost [--caps 16384,65536,262144] [--rounds 2000]

For each cap, the memory is filled to it (and past, so that it evicts) with synthetic answers of 400 ids:
runs copied from earlier answers (60%) between ids drawn from a Zipf law over 20,000 ids, so that n-grams
recur as they do in code and text. Then a request's drafter (drafters/suffix.py) over a Recall of that
memory runs `rounds` rounds (situation + propose K = 8, then 1-4 ids committed) along a context drawn the
same way; and further answers are remembered at the cap (each one evicting the oldest). Reported: µs per
round and per remembered answer, and the Python bytes the full memory holds. Flat across caps is the claim (a round reads a bounded number of
occurrences, never the history). A measurement script, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from speczoo.decoding.drafters.suffix import SuffixDrafter
from speczoo.decoding.drafters.suffix_memory import SuffixMemory

ANSWER = 400


def stream(rng: random.Random, past: list[int], n: int) -> list[int]:
    """n ids: copies of runs of `past` (60%), else Zipf draws."""
    out: list[int] = []
    while len(out) < n:
        if past and rng.random() < 0.6:
            at = rng.randrange(len(past))
            out += past[at:at + rng.randint(4, 40)]
        else:
            out.append(min(int(rng.paretovariate(1.1)), 20000))
    return out[:n]


def fill(cap: int, rng: random.Random) -> tuple[SuffixMemory, list[int]]:
    """A memory of `cap` filled to about its cap, and the ids remembered."""
    memory, past = SuffixMemory(cap), []
    while memory.size < cap - ANSWER:
        ans = stream(rng, past[-20000:], ANSWER)
        memory.remember(None, ans)
        past += ans
    return memory, past


def fill_bytes(cap: int, seed: int = 0) -> int:
    """The Python bytes a memory filled to `cap` holds (tracemalloc, in a fill of its own: it slows the timing)."""
    tracemalloc.start()
    try:
        memory, past = fill(cap, random.Random(seed))
        del past
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def measure(cap: int, rounds: int, seed: int = 0) -> tuple[float, float, int]:
    """(µs per round, µs per remembered answer at the cap, tokens held) for a memory of `cap`."""
    rng = random.Random(seed)
    memory, past = fill(cap, rng)
    context = stream(rng, past[-20000:], 500)
    commits = [stream(rng, past[-20000:], rng.randint(1, 4)) for _ in range(rounds)]
    d = SuffixDrafter(memory.open(None), prompt_len=len(context))
    t = time.perf_counter()
    for ids in commits:
        if d.situation(context) is not None:
            d.propose(context, 8)
        context += ids
    per_round = (time.perf_counter() - t) / rounds * 1e6
    del d                                     # its Recall no longer holds evicted answers back
    answers = [stream(rng, past[-20000:], ANSWER) for _ in range(20)]
    t = time.perf_counter()
    for ans in answers:
        memory.remember(None, ans)
    per_answer = (time.perf_counter() - t) / len(answers) * 1e6
    return per_round, per_answer, memory.held()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps", default="16384,65536,262144")
    ap.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args(argv)
    print(f"{'cap (tokens)':>12} {'µs/round':>9} {'µs/answer':>10} {'held':>8} {'MB':>6}")
    for cap in (int(c) for c in args.caps.split(",")):
        per_round, per_answer, held = measure(cap, args.rounds)
        print(f"{cap:12d} {per_round:9.1f} {per_answer:10.0f} {held:8d} {fill_bytes(cap) / 1e6:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
