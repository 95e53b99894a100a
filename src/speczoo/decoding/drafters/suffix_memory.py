"""The suffix drafter's memory of earlier answers, held by the runtime across requests (drafters/suffix.py).

What it holds: each finished answer of a request that used the suffix drafter, with the last few ids of
its prompt before it (Drafting.suffix_lead, so that a repeated request finds its answer from the first
token), per tenant: the API key a request came with (None without one). A request reads only its own
tenant's answers, since how fast an answer comes reveals whether a text matched; `pooled` puts every
tenant in one memory (`speczoo serve --pool-suffix-memory`, for a server whose users may see each
other's text).

Index: per tenant, n-gram (orders Drafting.suffix_orders) -> the positions right after its occurrences,
ascending, in one append-only position space. Remembering n ids registers about n · orders n-grams;
a lookup bisects one n-gram's list for the `limit` most recent occurrences it may see. So a round costs
O(orders + limit · K) however much is held, and remembering costs O(answer) when the request ends.

Cap and eviction: `cap` tokens over all tenants together (answers and their leads); past it, the
oldest answers are evicted first, whoever's they are. Capping the total, not each tenant, bounds the
process's memory whatever the number of keys.

Snapshot semantics: `open(tenant)` returns a `Recall` that sees exactly the answers remembered before
it was opened, whatever happens later: an answer remembered afterwards lies past its horizon, and an
answer evicted afterwards stays readable to it (its ids and index entries are freed once no open
Recall reaches back to it; until then the memory may hold more than `cap`). A request opens its Recall
when its drafters are built (decoding/engine.py `open`), so which drafts it gets depends on what had
finished when it started and on its own ids, never on when the other requests of a batch finish.

Ids only: never sees a model, a clock or a file. Not thread-safe: used from the one thread that runs
the engine (the server's worker).
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections import Counter, deque

from speczoo.decoding.tuning import DRAFTING

SEP = -1          # after each answer: a continuation that reaches it ends there

_POOL = object()  # the one memory key of a pooled memory


class _Store:
    """One tenant's answers: their ids in one position space (`tokens[p - base]`), the n-gram index, the
    span new Recalls see ([lo, end)), and the Recalls open on it."""

    def __init__(self, orders: tuple[int, int]):
        self.orders = range(orders[0], orders[1] + 1)
        self.tokens: list[int] = []
        self.base = 0                                         # the position of tokens[0]
        self.lo = 0                                           # evicted before this
        self.docs: deque[tuple[int, int]] = deque()           # (start, end) of the answers held, SEP included
        self.index: dict[tuple[int, ...], list[int]] = {}
        self.readers: weakref.WeakSet[Recall] = weakref.WeakSet()

    @property
    def end(self) -> int:
        return self.base + len(self.tokens)

    def append(self, ids: list[int]) -> int:
        """Hold `ids` (then SEP) and index every n-gram inside them; returns the positions used."""
        start, index = self.end, self.index
        for n in self.orders:
            for i in range(n, len(ids)):      # the n-gram ids[i-n:i] is followed by ids[i], at start + i
                index.setdefault(tuple(ids[i - n:i]), []).append(start + i)
        self.tokens.extend(ids)
        self.tokens.append(SEP)
        self.docs.append((start, self.end))
        return len(ids) + 1

    def trim(self) -> None:
        """Free the evicted answers no open Recall reaches back to (oldest first: each one's index
        entries are the front of their lists)."""
        floor = min([r.lo for r in self.readers], default=self.lo)
        floor = min(floor, self.lo)
        dropped = 0
        while self.docs and self.docs[0][1] <= floor:
            start, end = self.docs.popleft()
            ids = self.tokens[start - self.base:end - 1 - self.base]
            counts = Counter(tuple(ids[i - n:i]) for n in self.orders for i in range(n, len(ids)))
            for key, c in counts.items():
                occ = self.index[key]
                del occ[:c]
                if not occ:
                    del self.index[key]
            dropped = end - self.base
        if dropped:
            del self.tokens[:dropped]
            self.base += dropped


class Recall:
    """One request's read of its tenant's memory as it stood when opened (see the module docstring),
    and the way its answer is remembered when it ends."""

    def __init__(self, memory: SuffixMemory, key: object, store: _Store):
        self._memory, self._key, self._store = memory, key, store
        self.lo, self.hi = store.lo, store.end                # the answers it sees: positions [lo, hi)
        store.readers.add(self)

    @property
    def empty(self) -> bool:
        return self.hi <= self.lo

    def occurrences(self, key: tuple[int, ...], limit: int) -> list[int]:
        """Positions right after the `limit` most recent occurrences of `key` it may see (ascending)."""
        occ = self._store.index.get(key)
        if not occ:
            return []
        j = bisect_left(occ, self.hi)
        i = max(bisect_left(occ, self.lo, 0, j), j - limit)
        return occ[i:j]

    def token(self, p: int) -> int:
        """The id at position p (SEP at an answer's end, and before the oldest held answer)."""
        toks, i = self._store.tokens, p - self._store.base
        return toks[i] if 0 <= i < len(toks) else SEP

    def remember(self, ids: list[int]) -> None:
        """Add an answer (with its lead) to the memory, for requests opened from now on."""
        self._memory.add_to(self._key, ids)


class SuffixMemory:
    """Earlier answers per tenant, `cap` tokens in all, oldest evicted first (see the module docstring).

    cap: the most tokens held for new requests (0: remember nothing); pooled: one memory for every
    tenant; orders: the n-gram orders indexed (default Drafting.suffix_orders).
    """

    def __init__(self, cap: int = DRAFTING.suffix_memory_tokens, pooled: bool = False,
                 orders: tuple[int, int] = DRAFTING.suffix_orders):
        if cap < 0:
            raise ValueError(f"the suffix memory's cap must be >= 0 tokens, got {cap}")
        self.cap, self.pooled, self.orders = cap, pooled, orders
        self._stores: dict[object, _Store] = {}
        self._order: deque[tuple[object, int]] = deque()      # (key, size) of every answer held, oldest first
        self.size = 0                                         # tokens new requests see, all tenants

    def _key(self, tenant: str | None) -> object:
        return _POOL if self.pooled else tenant

    def open(self, tenant: str | None) -> Recall:
        """A request's Recall of `tenant`'s answers as they stand now."""
        key = self._key(tenant)
        store = self._stores.get(key)
        if store is None:
            store = self._stores[key] = _Store(self.orders)
        return Recall(self, key, store)

    def remember(self, tenant: str | None, ids: list[int]) -> None:
        """Add an answer of `tenant` (its lead included), evicting the oldest answers past the cap."""
        self.add_to(self._key(tenant), ids)

    def add_to(self, key: object, ids: list[int]) -> None:
        ids = ids[max(0, len(ids) + 1 - self.cap):]           # an answer longer than the cap: its end
        if not ids:
            return
        store = self._stores.setdefault(key, _Store(self.orders))
        size = store.append(ids)
        self._order.append((key, size))
        self.size += size
        touched = {key}
        while self.size > self.cap:
            old, n = self._order.popleft()
            s = self._stores[old]
            s.lo += n
            self.size -= n
            touched.add(old)
        for k in touched:
            s = self._stores[k]
            s.trim()
            if not s.docs and not s.readers:
                del self._stores[k]

    def held(self) -> int:
        """Tokens held now, evicted answers that open Recalls still read included (>= size)."""
        return sum(len(s.tokens) for s in self._stores.values())
