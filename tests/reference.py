"""Model-free oracles and the reference decoding loop, for property tests of the engine.

An oracle is a deterministic "language model": a function from the whole context to the next-token
logits. `OracleModel` wraps one behind the same forward contract as speczoo.models (tokens,
positions, cache -> logits), with `TokenCache` standing in for the KV cache (it stores token ids in
slots and obeys the same length / truncate / compact rules), so the real engine can be run against
it and compared with `reference_greedy`, the obviously-correct one-token-at-a-time loop.
Test code only: it lives in tests/, and the product never imports it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch import Tensor

from speczoo.errors import CacheFullError
from speczoo.models.forward import CHAIN, EVERY_ROW, Attend, Packed, Readout, Tree


def _h(*xs: int) -> int:
    return int.from_bytes(hashlib.blake2b(repr(xs).encode(), digest_size=8).digest(), "little")


@dataclass
class HashOracle:
    """Next token = a hash of the last `order` tokens: little repetition unless the vocab is tiny."""

    vocab: int
    seed: int = 0
    order: int = 2

    def logits(self, ctx: list[int]) -> Tensor:  # -> [V]
        top = _h(self.seed, *ctx[-self.order:]) % self.vocab
        out = torch.zeros(self.vocab)
        for v in range(self.vocab):            # a distinct, deterministic runner-up order
            out[v] = (_h(self.seed, 7, v, *ctx[-1:]) % 1000) / 1000.0
        out[top] = 2.0
        return out


@dataclass
class MarkovOracle:
    """Next token = table[last token]: cycles quickly, so prompt lookup finds many hits."""

    vocab: int
    seed: int = 0
    table: list[int] = field(default_factory=list)

    def __post_init__(self):
        g = torch.Generator().manual_seed(self.seed)
        self.table = torch.randint(0, self.vocab, (self.vocab,), generator=g).tolist()

    def logits(self, ctx: list[int]) -> Tensor:  # -> [V]
        out = torch.full((self.vocab,), -1.0)
        out[self.table[ctx[-1]]] = 1.0
        return out


class TokenCache:
    """Stands in for KVCache: slot i holds the token id at position i."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.slots: list[int] = []

    @property
    def length(self) -> int:
        return len(self.slots)

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.length:
            raise ValueError(f"truncate({n}) outside 0..{self.length}")
        del self.slots[n:]

    def compact(self, src: list[int], dst: int) -> None:
        moved = [self.slots[i] for i in src]
        self.slots[dst:dst + len(moved)] = moved

    def reset(self) -> None:
        self.slots = []


@dataclass
class OracleOut:
    logits: Tensor            # [S, V]
    hidden: list = field(default_factory=list)


class OracleModel:
    """An oracle behind the model forward contract: a causal chain, or a token tree given as Tree(mask)
    (row i then sees the committed slots and the rows mask[i] marks, and its position must be
    the committed length + its depth, as a real model's would be). It gives every row's logits and no
    hidden states, whatever the readout asks. gaps: a chain's positions may run ahead of the cache length
    (a draft's cache with skipped ids, DraftModelDrafter's window), still one apart and never behind it."""

    def __init__(self, oracle, gaps: bool = False):
        self.oracle = oracle
        self.gaps = gaps
        self.forwards = 0

    def __call__(self, tokens: Tensor, positions: Tensor, cache: TokenCache, *, attend: Attend = CHAIN,
                 readout: Readout = EVERY_ROW) -> OracleOut:
        if isinstance(attend, Packed):
            raise TypeError("OracleModel runs one sequence (a chain or a tree); packed rows need SlotOracle")
        ids = tokens.tolist()
        l0 = cache.length
        if l0 + len(ids) > cache.capacity:
            raise CacheFullError(f"cache full: {l0} + {len(ids)} > {cache.capacity}")
        if isinstance(attend, Tree):
            seen = [attend.mask[i].nonzero().flatten().tolist() for i in range(len(ids))]
        else:
            seen = [list(range(i + 1)) for i in range(len(ids))]
        ahead = positions[0].item() - l0 if self.gaps and not isinstance(attend, Tree) else 0
        want = [l0 + max(0, ahead) + len(rows) - 1 for rows in seen]
        if positions.tolist() != want:
            raise AssertionError(f"positions {positions.tolist()} do not follow the cache length {l0} "
                                 f"and the tree depths: expected {want}")
        self.forwards += 1
        prefix = list(cache.slots)
        cache.slots.extend(ids)
        return OracleOut(torch.stack([self.oracle.logits(prefix + [ids[j] for j in rows]) for rows in seen]))


def reference_greedy(oracle, prompt: list[int], n: int, eos: set[int] = frozenset()) -> list[int]:
    """Plain greedy decoding, one token at a time, straight from the oracle."""
    ctx = list(prompt)
    out: list[int] = []
    while len(out) < n:
        t = int(oracle.logits(ctx).argmax())
        if t in eos:
            break
        out.append(t)
        ctx.append(t)
    return out


@dataclass
class NoisyOracle:
    """Agrees with `base` except on a pseudo-random `miss` fraction of contexts: a stand-in draft model."""

    base: object
    miss: float = 0.3
    seed: int = 1

    @property
    def vocab(self) -> int:
        return self.base.vocab

    def logits(self, ctx: list[int]) -> Tensor:  # -> [V]
        out = self.base.logits(ctx).clone()
        if (_h(self.seed, *ctx[-3:]) % 1000) < self.miss * 1000:
            out[_h(self.seed, 5, *ctx[-2:]) % self.vocab] = 10.0
        return out


# ---------------------------------------------------------------- a recurrent state (a hybrid model's)

@dataclass
class RecurrentOracle:
    """A recurrent "language model": a state folded over every token, s_t = h(s_{t-1}, token_t), and the
    next token read off the state (and the last token, so that prompt lookup still finds repeats when
    `mix` is small). Its `logits` fold the whole context from scratch: the reference a model that keeps the
    state incrementally (RecurrentModel) must equal, however the engine rolls it back."""

    vocab: int
    seed: int = 0
    mix: float = 0.5        # the share of contexts whose next token follows the state rather than a table

    def __post_init__(self):
        self.table = MarkovOracle(self.vocab, self.seed).table

    def step(self, state: int, token: int) -> int:
        return _h(self.seed, state, token) % (1 << 32)

    def fold(self, ctx: list[int], state: int = 0) -> int:
        for t in ctx:
            state = self.step(state, t)
        return state

    def logits_after(self, state: int, last: int) -> Tensor:  # -> [V]
        out = torch.full((self.vocab,), -1.0)
        follows = (state % 1000) < self.mix * 1000
        out[(state >> 10) % self.vocab if follows else self.table[last]] = 1.0
        out[(state >> 20) % self.vocab] += 0.5                 # a runner-up that depends on the state
        return out

    def logits(self, ctx: list[int]) -> Tensor:  # -> [V]
        return self.logits_after(self.fold(ctx), ctx[-1])


class StateCache(TokenCache):
    """Stands in for a hybrid model's cache: token slots (what attention would see) and the recurrent
    state after each of the last `reach` rows (per-row states saved by the forward that wrote them, as
    speczoo's ConvRows keeps a convolution's inputs). truncate and compact restore the state from them; a
    length further back than `reach` rows from the furthest row written is refused, never guessed."""

    def __init__(self, capacity: int, reach: int = 80):
        super().__init__(capacity)
        self.reach = reach
        self.states: list[int | None] = []     # state after slot i (None: given up)
        self.floor = 0
        self.top = 0                           # furthest length written since the last reset

    @property
    def state(self) -> int:
        return self.states[-1] if self.states else 0

    def write(self, ids: list[int], states: list[int]) -> None:
        self.slots.extend(ids)
        self.states.extend(states)
        self.top = max(self.top, len(self.slots))
        forgot = max(0, self.floor - 1)
        self.floor = max(self.floor, self.top - self.reach)
        for i in range(forgot, max(0, self.floor - 1)):        # forget what the reach gave up
            self.states[i] = None

    def truncate(self, n: int) -> None:
        if 0 < n < self.floor:
            raise CacheFullError(f"the state after {n} rows is no longer held (the floor is {self.floor})")
        super().truncate(n)
        del self.states[n:]

    def compact(self, src: list[int], dst: int) -> None:
        super().compact(src, dst)
        moved = [self.states[i] for i in src]
        self.states[dst:dst + len(moved)] = moved

    def reset(self) -> None:
        super().reset()
        self.states, self.floor, self.top = [], 0, 0


class RecurrentModel(OracleModel):
    """A RecurrentOracle behind the model forward contract, keeping its state in a StateCache: each row's
    state is its predecessor's (the cache's last state, or its tree parent's row) stepped by its token,
    never folded from the context, so a wrong rollback shows in the tokens."""

    def __call__(self, tokens: Tensor, positions: Tensor, cache: StateCache, *, attend: Attend = CHAIN,
                 readout: Readout = EVERY_ROW) -> OracleOut:
        ids = tokens.tolist()
        if isinstance(attend, Packed):
            raise TypeError("RecurrentModel runs one sequence (a chain or a tree)")
        if cache.length + len(ids) > cache.capacity:
            raise CacheFullError(f"cache full: {cache.length} + {len(ids)} > {cache.capacity}")
        parents = ([int(attend.mask[i, :i].nonzero().max()) if attend.mask[i, :i].any() else -1
                    for i in range(len(ids))] if isinstance(attend, Tree) else list(range(-1, len(ids) - 1)))
        depth: list[int] = []
        for p in parents:
            depth.append(0 if p < 0 else depth[p] + 1)
        if positions.tolist() != [cache.length + d for d in depth]:
            raise AssertionError(f"positions {positions.tolist()} do not follow the cache length {cache.length} "
                                 f"and the tree depths {depth}")
        self.forwards += 1
        states, rows = [], []
        for t, p in zip(ids, parents):
            prev = cache.state if p < 0 else states[p]
            if prev is None:
                raise AssertionError("a row read a state the cache had given up")
            states.append(self.oracle.step(prev, t))
            rows.append(self.oracle.logits_after(states[-1], t))
        cache.write(ids, states)
        return OracleOut(torch.stack(rows))
