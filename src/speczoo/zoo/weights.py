"""A bundle's weights beyond its packing: the unpacked tensors written at pull time, and the fp32
reference weights rebuilt on demand from the model's source.

A lean bundle keeps only what its backend runs (see zoo/bundle.py). Whatever needs fp32 weights (the fp32
and bf16 backends, `speczoo check`, EAGLE training) gets them from `reference_tensors` or `load_model`,
which read the verified source (a zoo model's GGUF, assembled from its installed packages when the zoo no
longer keeps it; a user's GGUF file or HF directory, checked against the sha256 the manifest recorded)
through the same dequantizer the pull used, so the values are the ones older bundles stored in
weights.safetensors, bit for bit. A format-1 bundle's weights.safetensors is read as it is. This module
never writes fp32 weights to disk and never falls back to approximate weights (the packing dequantized):
a source that is gone is an error that names `speczoo pull NAME`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from speczoo.errors import IntegrityError, NotPulledError
from speczoo.models import loader
from speczoo.zoo import bundle as B
from speczoo.zoo.registry import MODELS
from speczoo.zoo.source import gguf_for_reading, hf_dir_sha256, sha256_file


@dataclass
class SourceTensor:
    """One tensor of a source as stored there: GGUF blocks of `encoding`, or (HF) fp32 with no encoding."""

    name: str
    encoding: str | None      # GGUF block type ("F32", "Q4_K", ...); None for an fp32 tensor from HF
    data: Tensor              # fp32 [out, in] when encoding is "F32" or None, else uint8 [..., bytes per row]

    def fp32(self) -> Tensor:
        if self.encoding in (None, "F32"):
            return self.data
        return loader.dequantize(self.data.numpy(), self.encoding)


def iter_source(kind: str, path: Path, names: Iterable[str] | None = None) -> Iterator[SourceTensor]:
    """The tensors of a GGUF file (kind "gguf") or an HF directory (kind "hf"), one at a time, in file
    order, under GGUF names (all, or those in `names`)."""
    wanted = None if names is None else set(names)
    if kind == "hf":
        from speczoo.zoo.hf import iter_hf_tensors
        for name, t in iter_hf_tensors(path):
            if wanted is None or name in wanted:
                yield SourceTensor(name, None, t)
        return
    from speczoo.zoo.gguf import open_gguf
    yield from iter_reader(open_gguf(path), wanted)


def iter_reader(reader, wanted: set[str] | None = None) -> Iterator[SourceTensor]:
    """The tensors of an open GGUF reader, as `iter_source` gives them (reading the header of a model with a
    large vocabulary takes seconds: open it once)."""
    from speczoo.zoo.gguf import iter_gguf_blocks
    for name, encoding, data in iter_gguf_blocks(reader, wanted):
        yield SourceTensor(name, encoding, data)


@contextmanager
def bundle_source(manifest: B.Manifest) -> Iterator[tuple[str, Path]]:
    """("gguf" or "hf", path) of the bundle's source, verified against the manifest, for the block."""
    src = manifest.source
    if src.kind == "zoo":
        if manifest.name not in MODELS:
            raise NotPulledError(f"bundle {manifest.name!r} comes from a zoo entry this speczoo does not know; "
                                 "its fp32 weights cannot be rebuilt")
        with gguf_for_reading(MODELS[manifest.name]) as path:
            yield "gguf", path
        return
    path = Path(src.path)
    if not path.exists():
        raise NotPulledError(f"the source of bundle {manifest.name!r} ({path}) is gone, and the bundle keeps no "
                             f"fp32 weights; put it back, or pull the model again (`speczoo pull PATH --force`)")
    got = hf_dir_sha256(path)[0] if src.kind == "hf" else sha256_file(path)
    if got != src.sha256:
        raise IntegrityError(f"the source {path} of bundle {manifest.name!r} changed since it was pulled (sha256 "
                             f"{got}, the manifest says {src.sha256}): fp32 weights rebuilt from it would not be "
                             f"the bundle's; pull it again (`speczoo pull {path} --force`)")
    yield src.kind, path


def source_names(kind: str, path: Path) -> list[str]:
    """The GGUF names of a source's tensors, in the order `iter_source` yields them."""
    if kind == "hf":
        from speczoo.zoo import hf
        arch = hf.HF_MODEL_TYPES[hf.read_config(path)["model_type"]]
        names = [n for n in (hf.gguf_name(k, arch) for k in hf.hf_tensor_names(path)) if n is not None]
        return names + (["output.weight"] if hf.hf_has_lm_head(path) else [])
    from speczoo.zoo.gguf import open_gguf
    return [t.name for t in open_gguf(path).tensors]


@dataclass
class Reference:
    """A bundle's fp32 reference weights, open for reading: `names`, and `tensors(names)` one at a time."""

    names: list[str]
    _iter: Callable[[set[str] | None], Iterator[tuple[str, Tensor]]]

    def tensors(self, names: Iterable[str] | None = None) -> Iterator[tuple[str, Tensor]]:
        return self._iter(None if names is None else set(names))


@contextmanager
def open_reference(bundle_dir: Path) -> Iterator[Reference]:
    """The bundle's reference weights for the block: its weights.safetensors (format 1), else its source."""
    bundle_dir = Path(bundle_dir)
    legacy = bundle_dir / B.LEGACY_WEIGHTS_FILE
    if legacy.is_file():
        with safe_open(str(legacy), framework="pt") as f:
            keys = list(f.keys())
            yield Reference(keys, lambda wanted: ((n, f.get_tensor(n)) for n in keys if wanted is None or n in wanted))
        return
    with bundle_source(B.read_manifest(bundle_dir)) as (kind, path):
        yield Reference(source_names(kind, path),
                        lambda wanted: ((st.name, st.fp32()) for st in iter_source(kind, path, wanted)))


def reference_tensors(bundle_dir: Path, names: Iterable[str] | None = None) -> dict[str, Tensor]:
    """The bundle's fp32 reference weights (all, or `names`), rebuilt from its source when it keeps none
    (the 1.5B: 7 GB of memory)."""
    wanted = None if names is None else list(names)
    with open_reference(bundle_dir) as ref:
        missing = sorted(set(wanted or ()) - set(ref.names))
        if missing:
            raise KeyError(f"the model of bundle {Path(bundle_dir).name} has no tensors {missing}")
        return dict(ref.tensors(wanted))


def lm_head_tensors(bundle_dir: Path) -> dict[str, Tensor]:
    """The fp32 LM head (output.weight, or token_embd.weight when the model ties them) and the final norm
    (output_norm.weight): what an EAGLE head starts from."""
    with open_reference(bundle_dir) as ref:
        head = "output.weight" if "output.weight" in ref.names else "token_embd.weight"
        return dict(ref.tensors([head, "output_norm.weight"]))


def load_model(bundle_dir: Path, backend: str = "fp32") -> nn.Module:
    """A pulled bundle built with `backend`: its stored packing, or the fp32 reference rebuilt from the source."""
    return loader.load_model(bundle_dir, backend, reference=lambda: reference_tensors(bundle_dir))


# ---------------------------------------------------------------- writing unpacked.safetensors

def _exact_float(t: Tensor) -> Tensor:
    """The narrowest float dtype that holds every value of fp32 `t` exactly (an HF bf16 embedding stays bf16)."""
    for dtype in (torch.bfloat16, torch.float16):
        narrow = t.to(dtype)
        if torch.equal(narrow.float(), t):
            return narrow
    return t


class UnpackedWriter:
    """Streams the tensors no backend packs into unpacked.safetensors in their source's encoding: GGUF
    blocks as stored (their type recorded in the metadata), F32 and HF tensors in the narrowest exact float
    dtype. `loader.read_unpacked` turns them back into the exact fp32 values."""

    def __init__(self, path: Path):
        self._writer = B.SafetensorsWriter(path)
        self._encodings: dict[str, str] = {}

    def add(self, st: SourceTensor) -> None:
        if st.encoding in (None, "F32"):
            self._writer.add(st.name, _exact_float(st.data))
        else:
            self._writer.add(st.name, st.data)
            self._encodings[st.name] = st.encoding

    def close(self) -> None:
        self._writer.close({"producer": "speczoo", loader.ENCODINGS_KEY: json.dumps(self._encodings)})

    def abort(self) -> None:
        self._writer.abort()
