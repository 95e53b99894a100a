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
a head trained on an accelerator) calls `.to_dense()`, which a plain Tensor answers with itself. It
never caches decoded rows and never writes the stored bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from speczoo.models.file_rows import FileRows

RowDecoder = Callable[[Tensor], Tensor]     # stored rows [N, R] -> their fp32 values [N, D]


class EncodedEmbedding:
    """A [V, D] fp32 embedding table held as V stored rows; `emb[ids]` decodes rows, `to_dense()` all."""

    dtype = torch.float32

    def __init__(self, stored: Tensor | FileRows, decode: RowDecoder):
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
        rows = self._decode(self.stored[flat])                    # [N, D]; bad ids raise IndexError here
        return rows.reshape(*idx.shape, self.shape[1])

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
