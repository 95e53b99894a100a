"""The order a packing's tensors are written in: the weights a model joins at load, end to end.

A block's q|k|v and gate|up run as one kernel call each (kernels/fused.py), over their packed parts joined
row-wise. Written member after member ("q.w8 q.sb k.w8 k.sb ..."), the join is a copy: the model then
holds those weights twice, the joined copy in anonymous memory and the file's pages it read them from.
`PackedWriter` writes each group part by part instead ("q.w8 k.w8 v.w8 q.sb k.sb v.sb ..."), so that each
joined part is one stretch of the file and the join is a view of the memory-mapped packing
(models/mapped.py, kernels/pack.py `join_rows`): weights held once, in the page cache. Which names join
comes from the architectures' layouts (models/registry.py `joined_linears`); the bytes of every tensor
are what the packer gave, only their order changes, and any reader of safetensors reads the file as before.

A group's members are held until the last arrives (they come one block at a time from a GGUF); if more
than HOLD_MAX tensors wait (a source in an unusual order), they are written as they are, which costs
only the view. A packing written before this order (`joined_end_to_end` says whether) is rewritten in it
by `lay_out`, a copy of its bytes (`speczoo pull NAME` does it). This module never packs or changes a tensor.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from torch import Tensor

from speczoo.models.mapped import read_header, read_mapped
from speczoo.models.registry import joined_linears
from speczoo.zoo.bundle import SafetensorsWriter

HOLD_MAX = 8        # packed weights held back at most, waiting for the rest of their group


class PackedWriter:
    """Writes packed weights (name -> parts) to a SafetensorsWriter as "<name>.<part>", each group of
    `joined_linears(names)` part by part. `close` writes what is still held and closes the file."""

    def __init__(self, writer: SafetensorsWriter, names: Iterable[str]):
        self.writer = writer
        self.groups = joined_linears(names)
        self.held: dict[str, dict[str, Tensor]] = {}        # arrival order

    def add(self, name: str, parts: dict[str, Tensor]) -> None:
        group = self.groups.get(name)
        if group is None:
            self._write([(name, parts)])
            return
        self.held[name] = parts
        if all(n in self.held for n in group):
            self._write([(n, self.held.pop(n)) for n in group])
        elif len(self.held) > HOLD_MAX:
            self.flush()

    def flush(self) -> None:
        """Write every held weight now, one after the other (their joins at load will copy)."""
        held, self.held = self.held, {}
        for name, parts in held.items():
            self._write([(name, parts)])

    def close(self, metadata: dict[str, str] | None = None) -> None:
        self.flush()
        self.writer.close(metadata)

    def abort(self) -> None:
        self.held = {}
        self.writer.abort()

    def _write(self, weights: list[tuple[str, dict[str, Tensor]]]) -> None:
        """Each part name in turn (in first-seen order), that part of every weight having it, in order."""
        for part in dict.fromkeys(p for _, parts in weights for p in parts):
            for name, parts in weights:
                if part in parts:
                    self.writer.add(f"{name}.{part}", parts[part])


def _by_weight(names: Iterable[str]) -> dict[str, list[str]]:
    """Packed tensor names "<weight>.<part>" -> weight -> its part names, in the order given."""
    out: dict[str, list[str]] = {}
    for n in names:
        weight, part = n.rsplit(".", 1)
        out.setdefault(weight, []).append(part)
    return out


def joined_end_to_end(path: Path) -> bool:
    """Whether every part of every joined group of the packing at `path` is one stretch of the file."""
    _, header = read_header(path)
    offsets = {n: v["data_offsets"] for n, v in header.items() if n != "__metadata__"}
    weights = _by_weight(offsets)
    for group in set(joined_linears(weights).values()):
        for part in {p for w in group for p in weights[w]}:
            spans = [offsets[f"{w}.{part}"] for w in group if f"{w}.{part}" in offsets]
            if any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
                return False
    return True


def lay_out(path: Path) -> None:
    """Rewrite the packing at `path` with its joined groups end to end (same tensors, same metadata;
    atomically: a temporary file, then a rename)."""
    path = Path(path)
    _, header = read_header(path)
    tensors = read_mapped(path)
    order = sorted(tensors, key=lambda n: header[n]["data_offsets"][0])           # as the file holds them
    weights = _by_weight(order)
    tmp = path.with_name(f".{path.name}.layout-{os.getpid()}")
    writer = PackedWriter(SafetensorsWriter(tmp), weights)
    try:
        for weight, parts in weights.items():
            writer.add(weight, {p: tensors[f"{weight}.{p}"] for p in parts})
        writer.close({k: v for k, v in header.get("__metadata__", {}).items() if k != "format"})
    except BaseException:
        writer.abort()
        raise
    os.replace(tmp, path)
