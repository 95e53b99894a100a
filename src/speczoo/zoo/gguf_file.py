"""Open a GGUF file for reading: `gguf`'s own reader, over a plain memory map.

`gguf.GGUFReader` parses the metadata one value at a time through slices of a `numpy.memmap`, and on
numpy 2.x every such slice pays memmap's subclass bookkeeping: a vocabulary of a few hundred thousand
tokens took tens of seconds to open. The reader here is the same class reading the same bytes, with its
`data` held as a plain ndarray view of the same map (zero-copy, still memory-mapped), so that each slice
is an ordinary view. It never parses GGUF itself: every field and tensor is what `gguf` reads.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from speczoo.errors import SpeczooError


class CorruptGGUFError(SpeczooError, ValueError):
    """A GGUF file that cannot be read: truncated, or not GGUF at all."""


class GGUFFile(gguf.GGUFReader):
    """gguf.GGUFReader whose memory map is exposed to its parser as a plain ndarray."""

    @property
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        # the reader assigns np.memmap(path) first thing; the view keeps that map alive through .base
        self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value


def open_gguf(path: Path | str) -> GGUFFile:
    """The GGUF file at `path`, memory-mapped, with a clear error when it is absent, truncated or corrupt
    (gguf's reader fails on those with an IndexError or a numpy reshape message, or reads tensors that end
    past the file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    size = path.stat().st_size
    try:
        reader = GGUFFile(path)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, IndexError, KeyError, OverflowError, TypeError, UnicodeDecodeError) as exc:
        raise CorruptGGUFError(f"{path} ({size:,} bytes) is not a readable GGUF file: it is truncated or corrupt "
                               f"(gguf's reader says: {exc}). Download or copy it again and check its sha256 "
                               "against the publisher's") from exc
    if end > size:
        raise CorruptGGUFError(f"{path} is truncated: its tensors end at byte {end:,} and the file has {size:,}. "
                               "Download or copy it again")
    return reader
