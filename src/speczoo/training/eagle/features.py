"""The head's training data: target features cached on disk by teacher-forced target forwards.

Self-distillation: a local corpus is tokenized with the target's tokenizer (or the target's own chat
answers come in as ids, answers.py), cut into chunks of L tokens, and each chunk goes through ONE
target forward that returns the hidden states of the head's three feature layers and the target's
logits. A shard stores, per chunk,
  features [N, L, 3D] bf16   the three layers' hidden states, concatenated (low ; mid ; high)
  ids      [N, L] int32      the chunk's tokens
  top1     [N, L] int32      the target's greedy prediction at each position (the head's label)
A manifest records what the cache was built from; a cache built from another target, other layers or
another corpus is an error, never silently mixed. Shards are written atomically, so an interrupted
extraction resumes at the first missing shard (the chunking is deterministic).
This module runs the target only through its public forward and never trains anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm import tqdm

from speczoo.cache import KVCache
from speczoo.models.forward import Readout

MANIFEST = "manifest.json"
CORPUS_SUFFIXES = (".py", ".pyi", ".md", ".rst", ".txt")


def default_corpus() -> list[Path]:
    """The Python standard library's source on this machine (code and docstrings: a fine start for the
    coder models)."""
    return [Path(sysconfig.get_paths()["stdlib"])]


def corpus_files(paths: Iterable[Path]) -> list[Path]:
    """Files of the corpus: each path as is, or a directory's text files (CORPUS_SUFFIXES), sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.suffix in CORPUS_SUFFIXES and f.is_file()))
        else:
            raise FileNotFoundError(f"corpus path {p} does not exist")
    if not out:
        raise ValueError(f"the corpus {[str(p) for p in paths]} has no text files ({', '.join(CORPUS_SUFFIXES)})")
    return out


def corpus_digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f}\0{f.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def chunk_stream(pieces: Iterable[list[int]], seq_len: int, separator: int | None = None) -> Iterator[list[int]]:
    """Chunks of exactly seq_len ids from pieces of ids, each followed by `separator` (e.g. an end-of-text
    id), as one stream; a tail shorter than seq_len is dropped."""
    buf: list[int] = []
    for ids in pieces:
        buf.extend(ids)
        if separator is not None:
            buf.append(separator)
        while len(buf) >= seq_len:
            yield buf[:seq_len]
            del buf[:seq_len]


def corpus_chunks(encode: Callable[[str], list[int]], files: list[Path], seq_len: int, seed: int = 0,
                  separator: int | None = None) -> Iterator[list[int]]:
    """Chunks of exactly seq_len ids: the files in a seeded random order, each tokenized and followed by
    `separator`, as one stream. Deterministic for the same arguments."""
    order = list(files)
    random.Random(seed).shuffle(order)
    texts = (f.read_text(encoding="utf-8", errors="replace") for f in order)
    return chunk_stream((encode(t) for t in texts if t.strip()), seq_len, separator)


@dataclass
class FeatureManifest:
    target: str
    layers: list[int]               # the target forward's hidden_layers (residual after layer i)
    hidden: int                     # D
    vocab: int                      # V of the target
    seq_len: int                    # L
    corpus: str                     # digest of the corpus file list
    seed: int
    shard_seqs: int                 # chunks per shard (the last one may hold fewer)
    shards: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)   # chunks in each shard
    seconds: float = 0.0            # extraction time so far

    def same_source(self, other: FeatureManifest) -> list[str]:
        """Fields that differ from `other` in what the features mean (empty: the same cache)."""
        keys = ("target", "layers", "hidden", "vocab", "seq_len", "corpus", "seed", "shard_seqs")
        return [k for k in keys if getattr(self, k) != getattr(other, k)]

    def write(self, d: Path) -> None:
        tmp = d / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, d / MANIFEST)

    @classmethod
    def read(cls, d: Path) -> FeatureManifest:
        return cls(**json.loads((d / MANIFEST).read_text()))


@dataclass
class ExtractStats:
    tokens: int          # tokens of features in the cache
    new_tokens: int      # extracted by this call
    seconds: float       # wall time of this call's target forwards

    @property
    def tok_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def extract(model, chunks: Iterable[list[int]], want: FeatureManifest, out_dir: Path, max_tokens: int,
            progress: bool = True) -> ExtractStats:
    """Fill out_dir with feature shards until it holds max_tokens tokens (or the corpus ends).

    model: a speczoo target (forward(tokens, positions, cache, readout=Readout(hidden_layers=...))). Shards already in
    out_dir are kept when its manifest matches `want`; a mismatch raises ValueError.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / MANIFEST).is_file():
        have = FeatureManifest.read(out_dir)
        diff = have.same_source(want)
        if diff:
            raise ValueError(f"the feature cache in {out_dir} was built with other {', '.join(diff)} "
                             f"({', '.join(f'{k}={getattr(have, k)!r}' for k in diff)}); use another --out "
                             "or delete that directory")
        man = have
    else:
        man = want
        man.write(out_dir)
    seq_len, per_shard = man.seq_len, man.shard_seqs
    done_seqs = sum(man.sizes)
    target_seqs = max_tokens // seq_len
    if done_seqs >= target_seqs:
        return ExtractStats(tokens=done_seqs * seq_len, new_tokens=0, seconds=0.0)
    cache = KVCache(model.args, seq_len, extra=0)
    new_tokens, seconds, written = 0, 0.0, 0.0
    bar = tqdm(total=target_seqs * seq_len, initial=min(done_seqs, target_seqs) * seq_len, unit="tok",
               unit_scale=True, desc="features", disable=not progress, dynamic_ncols=True)
    feats: list[Tensor] = []
    ids: list[Tensor] = []
    top1: list[Tensor] = []
    layers = tuple(man.layers)
    for i, chunk in enumerate(chunks):
        if i < done_seqs:
            continue
        t0 = time.perf_counter()
        tokens = torch.tensor(chunk, dtype=torch.long)                       # [L]
        cache.reset()
        with torch.no_grad():
            out = model(tokens, torch.arange(seq_len), cache, readout=Readout(hidden_layers=layers))
        feats.append(torch.cat(out.hidden, dim=-1).to(torch.bfloat16))       # [L, 3D]
        ids.append(tokens.to(torch.int32))
        top1.append(out.logits.argmax(-1).to(torch.int32))                  # [L]
        dt = time.perf_counter() - t0
        seconds += dt
        new_tokens += seq_len
        bar.update(seq_len)
        bar.set_postfix(tok_s=f"{new_tokens / seconds:.0f}")
        if len(feats) == per_shard or done_seqs + new_tokens // seq_len >= target_seqs:
            man.seconds += seconds - written
            written = seconds
            _write_shard(out_dir, man, feats, ids, top1)
            feats, ids, top1 = [], [], []
        if done_seqs + new_tokens // seq_len >= target_seqs:
            break
    bar.close()
    if feats:                                  # the corpus ended inside a shard
        man.seconds += seconds - written
        _write_shard(out_dir, man, feats, ids, top1)
    return ExtractStats(tokens=sum(man.sizes) * seq_len, new_tokens=new_tokens, seconds=seconds)


def _write_shard(out_dir: Path, man: FeatureManifest, feats: list[Tensor], ids: list[Tensor],
                 top1: list[Tensor]) -> None:
    name = f"shard_{len(man.shards):05d}.safetensors"
    tmp = out_dir / (name + ".tmp")
    save_file({"features": torch.stack(feats), "ids": torch.stack(ids), "top1": torch.stack(top1)}, str(tmp))
    os.replace(tmp, out_dir / name)
    man.shards.append(name)
    man.sizes.append(len(feats))
    man.write(out_dir)


class FeatureSet:
    """Read access to a feature cache: chunks by index, memory-mapped shard by shard."""

    def __init__(self, d: Path):
        self.dir = Path(d)
        if not (self.dir / MANIFEST).is_file():
            raise FileNotFoundError(f"{self.dir / MANIFEST} is missing: no feature cache there")
        self.manifest = FeatureManifest.read(self.dir)
        if not self.manifest.shards:
            raise ValueError(f"the feature cache in {self.dir} has no shards yet: extract features first")
        self._files = [safe_open(str(self.dir / s), framework="pt") for s in self.manifest.shards]
        self._where = [(sh, row) for sh, n in enumerate(self.manifest.sizes) for row in range(n)]

    def __len__(self) -> int:
        return len(self._where)

    @property
    def tokens(self) -> int:
        return len(self) * self.manifest.seq_len

    def get(self, index: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        """features [B, L, 3D] float32, ids [B, L] int64, top1 [B, L] int64 of the chunks `index`."""
        f, i, t = [], [], []
        for n in index:
            sh, row = self._where[n]
            h = self._files[sh]
            f.append(h.get_slice("features")[row:row + 1])
            i.append(h.get_slice("ids")[row:row + 1])
            t.append(h.get_slice("top1")[row:row + 1])
        return torch.cat(f).float(), torch.cat(i).long(), torch.cat(t).long()

    def top1_counts(self) -> Tensor:
        """How often the target predicted each id over the whole cache: [V] int64."""
        counts = torch.zeros(self.manifest.vocab, dtype=torch.long)
        for h in self._files:
            counts += torch.bincount(h.get_tensor("top1").flatten().long(), minlength=self.manifest.vocab)
        return counts
