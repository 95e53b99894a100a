"""A .safetensors file memory-mapped as ONE storage, each of its tensors a view into it.

    tensors = read_mapped(path)          # name -> tensor, every one sharing the file's single mapping

safetensors' own loader maps the same bytes, but hands out one storage per tensor, so tensors written end
to end in the file cannot be seen as one without a copy. Here they can: kernels/pack.py `join_rows` turns
the packed parts of q|k|v (or gate|up) into a view when the bundle stores them end to end (zoo/pull.py
writes them so), and a model then holds its weights once, in the page cache, as llama.cpp holds its
GGUF, instead of a file-backed original beside an anonymous joined copy.

The mapping is private (copy-on-write): nothing written to a tensor ever reaches the file, and the pages
are the page cache's until written, so they are shared between processes and reclaimable. A tensor whose
offset does not suit its element type (a file another writer laid out) is copied out of the mapping; one
whose bytes lie outside the file is an error that says to re-pull. This module reads, never writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def read_header(path: Path) -> tuple[int, dict]:
    """The byte offset where a safetensors file's data starts, and its JSON header (metadata included)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        raw = f.read(n)
    if len(raw) != n:
        raise ValueError(f"{path} is cut short inside its safetensors header; re-pull the model "
                         "(speczoo pull NAME --force)")
    return 8 + n, json.loads(raw)


def read_mapped(path: Path) -> dict[str, Tensor]:
    """Every tensor of the .safetensors file `path`, as views of one private memory map of the whole file."""
    path = Path(path)
    start, header = read_header(path)
    size = os.path.getsize(path)
    whole = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)   # [file bytes], mapped
    out: dict[str, Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which speczoo does not read")
        b0, b1 = (start + o for o in info["data_offsets"])
        if not start <= b0 <= b1 <= size:
            raise ValueError(f"{path}: tensor {name!r} lies outside the file (bytes {b0}..{b1} of {size}); the file "
                             "is damaged or cut short, re-pull the model (speczoo pull NAME --force)")
        raw = whole[b0:b1]
        item = torch.tensor([], dtype=dtype).element_size()
        if b0 % item:                                      # a view of another element size needs alignment
            raw = raw.clone()
        out[name] = raw.view(dtype).reshape(info["shape"])
    return out
