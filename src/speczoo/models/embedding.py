"""The token embedding kept in its stored encoding: rows are decoded to fp32 only when they are looked up.

A model reads its [V, D] embedding only by row lookup (`embed[tokens]`), so a lean bundle's embedding
stays as unpacked.safetensors holds it (GGUF blocks or a narrower float dtype, read from the file a row at a
time: models/file_rows.py; or a tensor in memory) and
`EncodedEmbedding[ids]` decodes just the rows asked for, with the decoder a full decode runs, on the same
bytes. Every GGUF block is decoded on its own (a row is whole blocks), so which other rows are decoded
alongside changes no bit: the rows equal those of the whole decoded matrix, bit for bit. For the 1.5B
this saves allocating and decoding a [151936, 1536] fp32 matrix (933 MB) at every load.

It stands in for the fp32 tensor where code looks rows up (indexing by ids, .shape, .dtype, .size()).
It never hands out the whole matrix implicitly: a caller that needs it (a tied LM head packed at load,
a head trained on an accelerator) calls `.to_dense()`, which a plain Tensor answers with itself. It never
writes the stored bytes.

A decode step looks up one to a few rows, and reading and decoding them (a pread and a dozen small tensor
operations) costs about half a millisecond, a few percent of a draft model's step; text repeats its
tokens, so the rows of small lookups (at most CACHE_LOOKUP ids) are kept decoded in a least-recently-used
cache of at most `cache_bytes` (CACHE_BYTES by default: some 2,700 rows of a 1.5B, 1,000 of an 8B). A
cached row is the row a fresh decode gives, bit for bit (each row is decoded on its own, above), so the cache
changes no output; lookups larger than CACHE_LOOKUP (a prompt's prefill, a head packed at load) decode
directly and leave it alone.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from speczoo.models.file_rows import FileRows

RowDecoder = Callable[[Tensor], Tensor]     # stored rows [N, R] -> their fp32 values [N, D]

CACHE_BYTES = 16 * 2**20    # decoded rows kept, at most, per embedding
CACHE_LOOKUP = 64           # a lookup of more ids than this decodes them directly, outside the cache


class EncodedEmbedding:
    """A [V, D] fp32 embedding table held as V stored rows; `emb[ids]` decodes rows, `to_dense()` all."""

    dtype = torch.float32

    def __init__(self, stored: Tensor | FileRows, decode: RowDecoder, cache_bytes: int = CACHE_BYTES):
        if stored.dim() != 2 or stored.shape[0] == 0:
            raise ValueError(f"an embedding is stored as [V, bytes or values per row] with V >= 1; got "
                             f"{tuple(stored.shape)}")
        self.stored = stored                                      # [V, R] as the file holds it (or its rows there)
        self._decode = decode
        first = decode(stored[:1])                                # [1, D]: the width, and a decoder that works
        if first.dtype != torch.float32 or first.dim() != 2 or first.shape[0] != 1:
            raise ValueError(f"the row decoder must turn stored rows [N, R] into fp32 [N, D]; it gave "
                             f"{first.dtype} {tuple(first.shape)} for one row")
        self.shape = torch.Size((stored.shape[0], first.shape[1]))
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0 (0: no cache); got {cache_bytes}")
        self.cache_rows = cache_bytes // (4 * self.shape[1])            # decoded rows kept at most
        self._rows: OrderedDict[int, Tensor] = OrderedDict()             # row id in [0, V) -> its [D] fp32 row
        self._lock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return self.stored.device

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, ids: Tensor | int | Sequence[int] | np.ndarray) -> Tensor:
        """ids of any shape [...] (a tensor, an int, a list) -> their rows, fp32 [..., D]."""
        idx = _token_ids(ids)
        flat = idx.reshape(-1)                                    # [N]
        if flat.numel() == 0:
            return torch.empty(*idx.shape, self.shape[1])
        if flat.numel() > min(CACHE_LOOKUP, self.cache_rows):
            rows = self._decode(self.stored[flat])                # [N, D]; bad ids raise IndexError here
        else:
            rows = self._cached(flat)
        return rows.reshape(*idx.shape, self.shape[1])

    def _cached(self, flat: Tensor) -> Tensor:
        """The rows of ids `flat` [N] (N <= cache_rows), each from the cache or decoded now and kept; a new
        [N, D] tensor (never a view of a cached row)."""
        v = self.shape[0]
        ids = flat.tolist()
        if not all(-v <= i < v for i in ids):
            return self._decode(self.stored[flat])               # raises the stored rows' IndexError
        ids = [i % v for i in ids]
        with self._lock:
            got = {i: self._rows[i] for i in ids if i in self._rows}
            for i in got:
                self._rows.move_to_end(i)
        missing = sorted(set(ids) - got.keys())
        if missing:
            decoded = self._decode(self.stored[torch.tensor(missing)])  # [M, D]
            fresh = {i: decoded[k].clone() for k, i in enumerate(missing)}
            got.update(fresh)
            with self._lock:
                self._rows.update(fresh)
                while len(self._rows) > self.cache_rows:
                    self._rows.popitem(last=False)                # the least recently used row
        return torch.stack([got[i] for i in ids])

    def __getstate__(self) -> dict:
        """A copy (copy, deepcopy, pickle) starts with an empty cache and a lock of its own."""
        state = dict(self.__dict__)
        del state["_rows"], state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._rows, self._lock = OrderedDict(), threading.Lock()

    def to_dense(self) -> Tensor:
        """The whole [V, D] fp32 matrix, decoded now (V * D * 4 bytes, a new tensor at every call)."""
        whole = self.stored.read() if isinstance(self.stored, FileRows) else self.stored
        return self._decode(whole).reshape(self.shape)

    def __repr__(self) -> str:
        return (f"EncodedEmbedding(shape={tuple(self.shape)}, stored={self.stored.dtype} "
                f"{tuple(self.stored.shape)})")


def _token_ids(ids: Tensor | int | Sequence[int] | np.ndarray) -> Tensor:
    """ids as an int64 CPU tensor of their own shape, or an error that says how to index."""
    if isinstance(ids, (Tensor, int, list, tuple, np.ndarray, np.integer)):
        idx = torch.as_tensor(ids)
        if not (idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool):
            if idx.device.type != "cpu":
                raise ValueError(f"an EncodedEmbedding decodes its rows on the CPU, and these ids are on "
                                 f"{idx.device}; give code that runs there the whole matrix, embed.to_dense()")
            return idx.long()
    raise TypeError(f"an EncodedEmbedding is indexed by token ids (an int, a list or an integer tensor), not "
                    f"{type(ids).__name__} {getattr(ids, 'dtype', '')}; for the whole [V, D] matrix call .to_dense()")
