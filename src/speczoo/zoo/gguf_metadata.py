"""A GGUF file's key-value metadata, read without its tensors, fast enough for a 262k-token vocabulary.

`gguf.GGUFReader` builds a numpy view per element of every array, which costs tens of seconds for a
large vocabulary's tokens and merges; building a tokenizer needs only the values. This module parses the
header and the key-value section (GGUF v2/v3, little-endian) into plain Python values: strings as str,
numeric arrays as lists. It never reads a tensor, and a file that is not a GGUF, or is cut short, is an
error saying so.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
# GGUF value types -> numpy dtypes (8 string, 9 array are handled apart).
_SCALARS = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
            7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path} ends inside its metadata: the file is truncated or not a GGUF")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        return bytes(self.take(self.u64())).decode("utf-8", errors="strict")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, n = self.u32(), self.u64()
            if inner == _STRING:
                return [self.string() for _ in range(n)]
            dtype = np.dtype(_SCALARS[inner]).newbyteorder("<")
            return np.frombuffer(self.take(n * dtype.itemsize), dtype=dtype).tolist()
        if kind not in _SCALARS:
            raise ValueError(f"{self.path}: unknown GGUF value type {kind}; the file is damaged or newer than speczoo")
        dtype = np.dtype(_SCALARS[kind]).newbyteorder("<")
        return np.frombuffer(self.take(dtype.itemsize), dtype=dtype)[0].item()


def read_gguf_metadata(path: Path) -> dict:
    """Every metadata key of the GGUF at `path` -> its value (str, int, float, bool or a list of them)."""
    path = Path(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        cur = _Cursor(memoryview(mm), path)
        try:
            if bytes(cur.take(4)) != MAGIC:
                raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
            version = cur.u32()
            if version not in (2, 3):
                raise ValueError(f"{path} is GGUF version {version}; speczoo reads versions 2 and 3")
            cur.u64()                                    # tensor count: not needed here
            out = {}
            for _ in range(cur.u64()):
                key = cur.string()
                out[key] = cur.value(cur.u32())
            return out
        finally:
            cur.buf.release()
