"""A 2-D tensor of a safetensors file whose rows are read from the file when asked, never memory-mapped.

A model looks its embedding up a few rows at a time, and a memory map of the table would count more than
those rows as resident: a fault on a file page the page cache holds maps its whole folio (a freshly
pulled file sits there in large folios), so each token looked up added up to ~1 MB of RSS, and a long
session would hold the whole table. `FileRows[ids]` reads just the rows asked for with pread into a new
tensor: the process holds what it reads and nothing else. Reads are positional, so threads may share it.
It never writes the file.
"""

from __future__ import annotations

import json
import os
import struct
import weakref
from pathlib import Path

import torch
from torch import Tensor

_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "F16": torch.float16, "BF16": torch.bfloat16,
           "F32": torch.float32, "I32": torch.int32, "I64": torch.int64, "F64": torch.float64}


def tensor_location(path: Path, name: str) -> tuple[int, torch.Size, torch.dtype]:
    """Where tensor `name` lies in a safetensors file: (byte offset of its data, shape, dtype). The format
    is an 8-byte little-endian header length, a JSON header with each tensor's data_offsets, then the data."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    entry = header[name]
    begin, _ = entry["data_offsets"]
    return 8 + n + begin, torch.Size(entry["shape"]), _DTYPES[entry["dtype"]]


class FileRows:
    """The [V, R] tensor `name` of safetensors file `path`; `rows[ids]` (an int64 tensor [N]) reads those
    rows, `rows[a:b]` a span, `rows.read()` all of it, each as a new [N, R] tensor of the file's dtype."""

    device = torch.device("cpu")

    def __init__(self, path: Path, name: str):
        self.path, self.name = Path(path), name
        self.offset, self.shape, self.dtype = tensor_location(path, name)
        if len(self.shape) != 2:
            raise ValueError(f"{name} in {path} is {tuple(self.shape)}; FileRows reads a [V, R] tensor by rows")
        self.row_bytes = self.shape[1] * self.dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)

    def __reduce__(self):
        """A copy (copy, deepcopy, pickle) opens the file again: never a second owner of this one's descriptor."""
        return FileRows, (self.path, self.name)

    def dim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, ids: Tensor | slice) -> Tensor:
        if isinstance(ids, slice):
            start, stop, step = ids.indices(self.shape[0])
            if step != 1:
                raise ValueError("FileRows reads a span of rows with step 1")
            return self._span(start, max(stop - start, 0))
        v, size = self.shape[0], self.row_bytes
        wanted = ids.reshape(-1).tolist()
        buf = bytearray(len(wanted) * size)
        view = memoryview(buf)
        for i, row in enumerate(wanted):
            if not -v <= row < v:
                raise IndexError(f"row id {row} is outside [-{v}, {v}) (the table has {v} rows)")
            self._read_into(view[i * size:(i + 1) * size], self.offset + (row % v) * size)
        return self._tensor(buf, len(wanted))

    def read(self) -> Tensor:
        """The whole [V, R] tensor."""
        return self._span(0, self.shape[0])

    def _span(self, start: int, n: int) -> Tensor:
        buf = bytearray(n * self.row_bytes)
        self._read_into(memoryview(buf), self.offset + start * self.row_bytes)
        return self._tensor(buf, n)

    def _read_into(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            got = os.pread(self._fd, len(view) - done, offset + done)
            if not got:
                raise EOFError(f"{self.path} ends before row data at byte {offset + done}: it is truncated; re-pull")
            view[done:done + len(got)] = got
            done += len(got)

    def _tensor(self, buf: bytearray, n: int) -> Tensor:
        if n == 0:
            return torch.empty(0, self.shape[1], dtype=self.dtype)
        return torch.frombuffer(buf, dtype=self.dtype).reshape(n, self.shape[1])

    def __repr__(self) -> str:
        return f"FileRows({tuple(self.shape)}, {self.dtype})"
