"""The on-disk bundle a pulled model becomes, and how to find, read and check one.

A bundle is a directory under `paths.bundles_dir()/NAME` holding:

    manifest.json             format_version, name, source (kind, path, sha256, size), architecture,
                              quantization summary, packed linear backends and each one's packing table
                              (source type -> kernel format, measured weight error), creation time,
                              file sizes
    config.json               ModelArgs
    weights-<backend>.safetensors   the packing of the backend it runs: "<tensor name>.<part>"
    unpacked.safetensors      the tensors no backend packs (embedding, norms, biases) in the source's own
                              encoding (GGUF blocks, or a float dtype that holds them exactly)
    tokenizer.json, tokenizer_config.json, chat_template.jinja (when the model has one)

A tied LM head is stored in the packing only when its backend packs slowly (q4); q8 packs it from the
embedding at load (models/loader.py `stored_linear_sources`). That is all a bundle needs to run. The fp32 reference weights (the fp32 and bf16 backends, `speczoo
check`, EAGLE training) are rebuilt on demand from the source (speczoo.zoo.weights), so a bundle is about
the size of its model. Bundles of format 1 also hold weights.safetensors (every tensor in fp32, 4-8x the
model); they still load, and `speczoo pull NAME` slims them, as it drops a stored tied head (format 2).

A bundle appears only complete: `zoo.pull` builds it in a temporary directory and renames it into place,
and the manifest is replaced atomically. This module never writes a bundle's content itself (beyond the
streaming safetensors writer and the manifest) and never treats a missing or mismatching bundle as
usable: it says how to re-pull.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from speczoo import paths
from speczoo.errors import NotPulledError
from speczoo.models.loader import CONFIG_FILE, LEGACY_WEIGHTS_FILE, UNPACKED_FILE, packed_weights_file
from speczoo.zoo.registry import MODELS, resolve
from speczoo.zoo.source import hf_dir_files, hf_dir_sha256, keep_gguf, sha256_file, zoo_source_sha256

__all__ = ["CONFIG_FILE", "LEGACY_WEIGHTS_FILE", "UNPACKED_FILE", "packed_weights_file", "hf_dir_files",
           "hf_dir_sha256", "sha256_file"]

# 4: the manifest's `packing` table (source type -> kernel format, measured error), which a speczoo reading
# only 1..3 could not parse; 3: a tied LM head whose packing is cheap (q8) is packed at load, not stored;
# 2: lean (packing + unpacked tensors); 1: with weights.safetensors in fp32. A speczoo reading only 1 and 2
# would miss the head of a 3.
FORMAT_VERSION = 4
READABLE_FORMATS = (1, 2, 3, 4)
MANIFEST_FILE = "manifest.json"
SOURCE_KINDS = ("zoo", "gguf", "hf")   # registry entry (assembled GGUF), a user's GGUF file, a user's HF dir


def packed_metadata(backend: str) -> dict[str, str]:
    """The metadata of a stored packing: who wrote it, for which backend, in which layout (PACK_LAYOUT)."""
    from speczoo.kernels.pack import PACK_LAYOUT
    return {"producer": "speczoo", "backend": backend, "layout": str(PACK_LAYOUT)}


@dataclass
class SourceInfo:
    kind: str          # one of SOURCE_KINDS
    path: str          # the GGUF file (zoo, gguf) or the HF directory (hf)
    sha256: str        # of the GGUF file; of the HF directory's files (see `hf_dir_sha256`)
    size: int          # bytes


@dataclass
class Manifest:
    name: str
    source: SourceInfo
    architecture: str
    quantization: dict[str, int]        # tensor type -> count in the source (HF: the safetensors dtypes)
    packed_backends: list[str]          # backends with a weights-<backend>.safetensors in the bundle
    created: str                        # ISO 8601, UTC
    files: dict[str, int] = field(default_factory=dict)   # bundle file -> size in bytes
    chat_template_source: str | None = None               # "gguf", "hf", "builtin:<name>" or None
    # backend -> its packing table: one row per (source type, kernel format) with the tensors, weights and
    # the measured error (zoo/policy.py PackRow.to_json); empty for packings made before format 4
    packing: dict[str, list[dict]] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def legacy(self) -> bool:
        """A format-1 bundle: it keeps every tensor in fp32 beside its packing."""
        return self.format_version == 1

    def write(self, bundle_dir: Path) -> None:
        """Replace the manifest atomically (temporary file, then rename)."""
        final = Path(bundle_dir) / MANIFEST_FILE
        tmp = final.with_name(f".{MANIFEST_FILE}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, final)

    @classmethod
    def read(cls, bundle_dir: Path) -> Manifest:
        f = Path(bundle_dir) / MANIFEST_FILE
        if not f.is_file():
            raise NotPulledError(f"{bundle_dir} has no {MANIFEST_FILE}: it is not a (complete) bundle; "
                                 "pull the model again with `speczoo pull NAME --force`")
        d = json.loads(f.read_text())
        if d.get("format_version") not in READABLE_FORMATS:
            raise NotPulledError(f"{bundle_dir} is bundle format {d.get('format_version')}, this speczoo reads "
                                 f"{list(READABLE_FORMATS)}; re-pull it with "
                                 f"`speczoo pull {d.get('name', 'NAME')} --force`")
        d["source"] = SourceInfo(**d["source"])
        return cls(**d)


def read_manifest(bundle_dir: Path) -> Manifest:
    return Manifest.read(bundle_dir)


def source_sha256(source: SourceInfo, name: str) -> str:
    """The sha256 of the source of bundle `name` as it is on disk now: a zoo model's kept GGUF, else its
    installed chunks; a user's GGUF or HF directory. FileNotFoundError or NotPulledError when it is gone."""
    p = Path(source.path)
    if source.kind == "zoo":
        if name not in MODELS:
            raise FileNotFoundError(f"bundle {name!r} comes from a zoo entry this speczoo does not know")
        return zoo_source_sha256(MODELS[name])
    if source.kind == "hf":
        if not p.is_dir():
            raise FileNotFoundError(f"source directory {p} no longer exists")
        return hf_dir_sha256(p)[0]
    if not p.is_file():
        raise FileNotFoundError(f"source GGUF {p} no longer exists")
    return sha256_file(p)


@dataclass
class BundleCheck:
    ok: bool
    reason: str                    # why not ok ("" when ok)
    manifest: Manifest | None
    source_verified: bool | None   # None: not hashed


def check_bundle(bundle_dir: Path, hash_source: bool = True) -> BundleCheck:
    """Is this bundle complete (files of the recorded sizes) and, when hashed, is its source unchanged?"""
    bundle_dir = Path(bundle_dir)
    try:
        m = Manifest.read(bundle_dir)
    except (NotPulledError, ValueError, TypeError, KeyError) as exc:
        return BundleCheck(False, f"unreadable manifest: {exc}", None, None)
    for name, size in m.files.items():
        f = bundle_dir / name
        if not f.is_file():
            return BundleCheck(False, f"{name} is missing", m, None)
        if f.stat().st_size != size:
            return BundleCheck(False, f"{name} is {f.stat().st_size} bytes, the manifest says {size}", m, None)
    if not hash_source:
        return BundleCheck(True, "", m, None)
    try:
        got = source_sha256(m.source, m.name)
    except (FileNotFoundError, NotPulledError) as exc:
        return BundleCheck(False, str(exc), m, False)
    if got != m.source.sha256:
        return BundleCheck(False, f"source {m.source.path} has sha256 {got}, the manifest says {m.source.sha256}",
                           m, False)
    return BundleCheck(True, "", m, True)


def bundle_dir_for(name: str) -> Path:
    return paths.bundles_dir() / name


def find_bundle(name_or_path: str | os.PathLike) -> Path:
    """The bundle directory of a zoo name, a bundle directory, or a local GGUF / HF source already pulled.

    Raises NotPulledError (with the pull command) for a known model without a bundle, and the registry's
    UnknownModelError for a name the zoo does not know.
    """
    p = Path(name_or_path)
    if p.is_dir() and (p / MANIFEST_FILE).is_file():
        return p
    src = resolve(str(name_or_path))
    d = bundle_dir_for(src.name)
    if not (d / MANIFEST_FILE).is_file():
        raise NotPulledError(f"model {src.name!r} is not pulled yet; run `speczoo pull {name_or_path}`")
    return d


def source_gguf(bundle_dir: Path) -> Path:
    """The GGUF file a bundle was converted from (the parity gate reloads it in transformers, peers run it).

    A zoo model's GGUF is assembled again from its installed packages into the zoo's downloads when it is
    not there (and kept until the next `speczoo pull`); NotPulledError says to pull when they are gone.
    """
    m = Manifest.read(bundle_dir)
    if m.source.kind == "hf":
        raise ValueError(f"bundle {m.name!r} was converted from a Hugging Face directory ({m.source.path}), "
                         "not a GGUF; load that directory directly")
    if m.source.kind == "zoo" and m.name in MODELS:
        return keep_gguf(MODELS[m.name])
    p = Path(m.source.path)
    if not p.is_file():
        raise FileNotFoundError(f"the source GGUF {p} of bundle {m.name!r} is gone; put it back, or pull the "
                                f"model again from another file (`speczoo pull /path/to/model.gguf --force`)")
    return p


def list_bundles() -> list[Path]:
    return sorted(d for d in paths.bundles_dir().iterdir()
                  if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST_FILE).is_file())   # not a pull's temp


def dir_size(d: Path) -> int:
    return sum(f.stat().st_size for f in Path(d).iterdir() if f.is_file())


_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
           torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
           torch.bool: "BOOL"}


class SafetensorsWriter:
    """Writes a .safetensors file one tensor at a time, so no more than one tensor is ever in memory.

    The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte
    offsets) and the raw data. The data goes after a reserved header area; `close` writes the header
    there, padded with spaces (which the format allows). A header too big for the area costs one copy.
    """

    def __init__(self, path: Path, reserve: int = 1 << 20):
        self.path = Path(path)
        self.reserve = reserve
        self._f = open(self.path, "wb")
        self._f.seek(8 + reserve)
        self._header: dict[str, dict] = {}
        self._offset = 0

    def add(self, name: str, tensor: Tensor) -> None:
        if name in self._header:
            raise ValueError(f"tensor {name!r} written twice to {self.path}")
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store")
        t = tensor.detach().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        n = t.numel() * t.element_size()
        self._f.write(data)
        self._header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                              "data_offsets": [self._offset, self._offset + n]}
        self._offset += n

    def close(self, metadata: dict[str, str] | None = None) -> None:
        header = dict(self._header)
        header["__metadata__"] = {"format": "pt", **(metadata or {})}
        raw = json.dumps(header, separators=(",", ":")).encode()
        if len(raw) <= self.reserve:
            self._f.seek(0)
            self._f.write(len(raw.ljust(self.reserve)).to_bytes(8, "little") + raw.ljust(self.reserve))
            self._f.close()
            return
        self._f.close()
        self._rewrite(raw)

    def _rewrite(self, raw: bytes) -> None:
        """Header bigger than the reserved area: copy the data behind a header of the right size."""
        pad = (-len(raw)) % 8
        tmp = self.path.with_name(self.path.name + ".rewrite")
        with open(self.path, "rb") as src, open(tmp, "wb") as dst:
            dst.write((len(raw) + pad).to_bytes(8, "little") + raw + b" " * pad)
            src.seek(8 + self.reserve)
            shutil.copyfileobj(src, dst, 1 << 24)
        os.replace(tmp, self.path)

    def abort(self) -> None:
        self._f.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
