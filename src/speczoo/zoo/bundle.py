"""The on-disk bundle a pulled model becomes, and how to find, read and check one.

A bundle is a directory under `paths.bundles_dir()/NAME` holding:

    manifest.json             format_version, name, source (kind, path, sha256, size), architecture,
                              quantization summary, packed linear backends, creation time, file sizes
    config.json               ModelArgs
    weights.safetensors       every tensor in fp32, GGUF names, torch [out, in] orientation
    weights-<backend>.safetensors   for a backend whose packing is stored: "<tensor name>.<part>"
    tokenizer.json, tokenizer_config.json, chat_template.jinja (when the model has one)

A bundle appears only complete: `zoo.pull` builds it in a temporary directory and renames it into place.
This module never writes a bundle's content itself (beyond the streaming safetensors writer it offers)
and never treats a missing or mismatching bundle as usable: it says how to re-pull.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from speczoo import paths
from speczoo.errors import NotPulledError

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"
SOURCE_KINDS = ("zoo", "gguf", "hf")   # registry entry (assembled GGUF), a user's GGUF file, a user's HF dir


def packed_weights_file(backend: str) -> str:
    return f"weights-{backend}.safetensors"


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
    format_version: int = FORMAT_VERSION

    def write(self, bundle_dir: Path) -> None:
        (Path(bundle_dir) / MANIFEST_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, bundle_dir: Path) -> Manifest:
        f = Path(bundle_dir) / MANIFEST_FILE
        if not f.is_file():
            raise NotPulledError(f"{bundle_dir} has no {MANIFEST_FILE}: it is not a (complete) bundle; "
                                 "pull the model again with `speczoo pull NAME --force`")
        d = json.loads(f.read_text())
        if d.get("format_version") != FORMAT_VERSION:
            raise NotPulledError(f"{bundle_dir} is bundle format {d.get('format_version')}, this speczoo reads "
                                 f"{FORMAT_VERSION}; re-pull it with `speczoo pull {d.get('name', 'NAME')} --force`")
        d["source"] = SourceInfo(**d["source"])
        return cls(**d)


def read_manifest(bundle_dir: Path) -> Manifest:
    return Manifest.read(bundle_dir)


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def hf_dir_files(hf_dir: Path) -> list[Path]:
    """The files of a Hugging Face directory that define the model (what its digest covers)."""
    hf_dir = Path(hf_dir)
    names = {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
             "chat_template.jinja", "special_tokens_map.json"}
    return sorted(p for p in hf_dir.iterdir() if p.is_file() and (p.name in names or p.suffix == ".safetensors"))


def hf_dir_sha256(hf_dir: Path) -> tuple[str, int]:
    """(sha256, total bytes) over the directory's model files: name, size and content of each, in order."""
    h = hashlib.sha256()
    total = 0
    for p in hf_dir_files(hf_dir):
        size = p.stat().st_size
        h.update(f"{p.name}\0{size}\0".encode())
        h.update(bytes.fromhex(sha256_file(p)))
        total += size
    return h.hexdigest(), total


def source_sha256(source: SourceInfo) -> str:
    """The sha256 of the source as it is on disk now (raises FileNotFoundError when it is gone)."""
    p = Path(source.path)
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
        got = source_sha256(m.source)
    except FileNotFoundError as exc:
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
    from speczoo.zoo.registry import resolve
    src = resolve(str(name_or_path))
    d = bundle_dir_for(src.name)
    if not (d / MANIFEST_FILE).is_file():
        raise NotPulledError(f"model {src.name!r} is not pulled yet; run `speczoo pull {name_or_path}`")
    return d


def source_path(bundle_dir: Path) -> Path:
    """Where the bundle's source lives (GGUF file or HF directory)."""
    return Path(Manifest.read(bundle_dir).source.path)


def source_gguf(bundle_dir: Path) -> Path:
    """The GGUF file a bundle was converted from (the parity gate reloads it in transformers)."""
    m = Manifest.read(bundle_dir)
    if m.source.kind == "hf":
        raise ValueError(f"bundle {m.name!r} was converted from a Hugging Face directory ({m.source.path}), "
                         "not a GGUF; load that directory directly")
    p = Path(m.source.path)
    if not p.is_file():
        raise FileNotFoundError(f"the source GGUF {p} of bundle {m.name!r} is gone; run `speczoo pull {m.name} "
                                "--force` to assemble it again")
    return p


def list_bundles() -> list[Path]:
    return sorted(d for d in paths.bundles_dir().iterdir() if d.is_dir() and (d / MANIFEST_FILE).is_file())


def dir_size(d: Path) -> int:
    return sum(f.stat().st_size for f in Path(d).iterdir() if f.is_file())


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished directory into place, replacing an old one only once the new one is there."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old)


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
