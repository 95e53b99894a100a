"""The statistical harness of the lossless-sampling tests: random oracle distributions, the exact target
distributions they imply, and a chi-square test of emitted tokens against them (test_verify_sampling.py,
test_tree_sampling.py: the verify rules alone; test_engine_sampling.py, test_tree_engine.py: through the
engine). Imported by test files, never a test itself.

The test: N = 10,000 independent sequences per configuration, each built from draft/verify rounds until
it has L = 3 tokens; the empirical distribution of (token 0, token 1) and of each position's token is
compared with the exact target distribution (cells with expected count < 5 pooled) and must have
p > P_THRESHOLD. Seeds are fixed, so the tests are deterministic.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections import Counter

import torch
from torch import Tensor

from speczoo.request import SamplingParams
from speczoo.sampling import probs

N_SEQ = 10_000
L = 3
P_THRESHOLD = 1e-3


class Oracle:
    """A deterministic random distribution over V tokens for each (position ≤ 3, last two tokens).

    With `base` (the target oracle) it is a drafter: a mix of the target's row and its own noise, so
    that acceptance is moderate and multi-token accepted runs are exercised. With `keep` it gives no
    probability to ids >= keep, as a drafter with a reduced vocabulary does (decoding/drafters/draft_head.py).
    """

    def __init__(self, v: int, seed: int, sharpness: float, zero_frac: float,
                 base: Oracle | None = None, base_weight: float = 0.0, keep: int | None = None):
        self.v, self.seed, self.sharpness, self.zero_frac = v, seed, sharpness, zero_frac
        self.base, self.base_weight, self.keep = base, base_weight, keep
        self.cache: dict[tuple[int, ...], tuple[Tensor, list[float]]] = {}

    def _row(self, prefix: tuple[int, ...]) -> tuple[Tensor, list[float]]:
        key = (min(len(prefix), 3),) + prefix[-2:]
        hit = self.cache.get(key)
        if hit is None:
            g = torch.Generator().manual_seed(hash((self.seed,) + key) & 0x7FFFFFFF)
            x = torch.rand(self.v, generator=g, dtype=torch.float64) ** self.sharpness   # [V]
            x[torch.rand(self.v, generator=g) < self.zero_frac] = 0.0     # top-k-like zeros
            x[int(torch.randint(self.v, (1,), generator=g))] += 0.05        # never all zero
            row = x / x.sum()
            if self.base is not None:
                row = self.base_weight * self.base(prefix) + (1 - self.base_weight) * row
                row[torch.rand(self.v, generator=g) < self.zero_frac] = 0.0
                row[int(torch.randint(self.v, (1,), generator=g))] += 0.05
                row = row / row.sum()
            if self.keep is not None:
                row[self.keep:] = 0.0
                row[int(torch.randint(self.keep, (1,), generator=g))] += 0.05
                row = row / row.sum()
            hit = (row, list(itertools.accumulate(row.tolist())))
            self.cache[key] = hit
        return hit

    def __call__(self, prefix: tuple[int, ...]) -> Tensor:
        return self._row(prefix)[0]

    def draw(self, prefix: tuple[int, ...], rng: random.Random) -> int:
        """A token drawn from this row (inverse CDF; cheaper than torch.multinomial per call)."""
        cum = self._row(prefix)[1]
        return min(bisect.bisect_right(cum, rng.random() * cum[-1]), self.v - 1)


def chi_square_p(counts: Counter, expected: dict, n: int) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 are pooled into one."""
    stat, cells, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for cell, prob in expected.items():
        e = prob * n
        if e < 5:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += e
            continue
        stat += (counts.get(cell, 0) - e) ** 2 / e
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-12)
        cells += 1
    impossible = sum(c for cell, c in counts.items() if cell not in expected)
    if impossible:
        return 0.0      # a token the target gives probability 0 was emitted
    df = cells - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def exact_target(p: Oracle) -> tuple[dict, list[dict]]:
    """The target's exact joint of tokens (0, 1) and the marginal of each position < L."""
    v = p.v
    prefixes = {(): 1.0}
    marginals = []
    joint01: dict = {}
    for pos in range(L):
        marg: dict = {}
        nxt: dict = {}
        for prefix, w in prefixes.items():
            row = p(prefix)
            for t in range(v):
                pt = w * float(row[t])
                if pt == 0.0:
                    continue
                marg[t] = marg.get(t, 0.0) + pt
                nxt[prefix + (t,)] = pt
        marginals.append(marg)
        prefixes = nxt
        if pos == 1:
            joint01 = dict(nxt)
    return joint01, marginals


def lossless_p_values(seqs: list[tuple[int, ...]], p: Oracle) -> dict[str, float]:
    joint01, marginals = exact_target(p)
    n = len(seqs)
    res = {"tokens 0,1": chi_square_p(Counter(s[:2] for s in seqs), joint01, n)}
    for pos in range(L):
        res[f"position {pos}"] = chi_square_p(Counter(s[pos] for s in seqs), marginals[pos], n)
    return res


def oracles(v: int, seed: int, keep: int | None = None) -> tuple[Oracle, Oracle]:
    # Target and drafter differ (acceptance about one half) and both have zeros the other lacks; with
    # `keep`, the drafter proposes from the first `keep` ids only (a reduced draft vocabulary).
    p = Oracle(v, seed, sharpness=3.0, zero_frac=0.25)
    return p, Oracle(v, seed + 100, 2.0, 0.15, base=p, base_weight=0.6, keep=keep)


# The engine-level tests' target: V tokens continuing PROMPT, sampled with PARAMS.
V = 5
PROMPT = [1, 2, 1, 2]
PARAMS = SamplingParams(temperature=1.0, top_k=4)


def exact_joint(oracle, n: int) -> dict:
    """The exact probability of every sequence of n tokens the engine may emit after PROMPT (those > 0)."""
    out = {}
    for seq in itertools.product(range(V), repeat=n):
        p, ctx = 1.0, list(PROMPT)
        for t in seq:
            p *= float(probs(oracle.logits(ctx)[None], PARAMS)[0, t])
            ctx.append(t)
        if p > 0:
            out[seq] = p
    return out
