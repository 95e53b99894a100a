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
    """The GGUF file at `path`, memory-mapped, with a clear error when it is absent or not a GGUF."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    try:
        return GGUFFile(path)
    except (ValueError, IndexError) as exc:  # gguf's words: bad magic, unknown version, data cut short
        raise ValueError(f"{path} is not a readable GGUF file ({exc}); re-download it") from exc
