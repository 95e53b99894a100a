"""Perplexity of a loaded model on a text, by llama-perplexity's protocol, and its agreement with a reference.

The protocol (llama.cpp tools/perplexity, `perplexity()`): the whole text is tokenized with the model's
special tokens (a BOS where the GGUF asks for one), the ids are cut into `n_chunks` chunks of `n_ctx`
(at most len // n_ctx, and at least two chunks' worth of ids are needed), each chunk runs alone from an
empty cache with its first id replaced by BOS where the model adds one, and only the second half is
scored: the logits at positions n_ctx/2 .. n_ctx - 2 predict the ids at n_ctx/2 + 1 .. n_ctx - 1. So a
chunk scores n_ctx - n_ctx/2 - 1 positions, and speczoo's figure and llama.cpp's are over the same ids.

Beside the perplexity, against a reference model's logits at the same positions (the fp32 reference, the
GGUF dequantized): the top-1 agreement (the fraction of positions whose argmax equals the reference's) and
the mean KL divergence KL(reference || model). The reference's log-probabilities are kept between the two
runs in a float32 file the caller names (0.6 GB for 1,000 positions of a 150k vocabulary; float16 would
err by ~1e-3 in the KL, the size of what it measures).
This module never loads a model or runs llama.cpp itself: callers pass a model (or a logits function).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from speczoo.cache import KVCache
from speczoo.models.forward import Readout

LogitsFn = Callable[[Tensor], Tensor]        # one chunk's ids [C] -> logits of its scored rows [C/2 - 1, V]


@dataclass(frozen=True)
class Chunks:
    """The ids a perplexity run evaluates: `ids` [n_chunks, n_ctx] as the model sees them (BOS first where
    the model adds one) and `targets` [n_chunks, n_ctx] as the text has them (what the scores predict)."""

    ids: Tensor
    targets: Tensor

    @property
    def n_ctx(self) -> int:
        return int(self.ids.shape[1])

    @property
    def first(self) -> int:                  # the first scored logit row of a chunk
        return self.n_ctx // 2

    @property
    def scored_per_chunk(self) -> int:
        return self.n_ctx - self.first - 1

    @property
    def positions(self) -> int:
        return self.ids.shape[0] * self.scored_per_chunk

    def scored_targets(self) -> Iterator[Tensor]:     # per chunk: the ids its scored rows predict [P]
        for t in self.targets:
            yield t[self.first + 1:]


def make_chunks(tokens: list[int], n_ctx: int, n_chunks: int | None, bos_id: int | None) -> Chunks:
    """Cut the text's ids (tokenized with the model's special tokens) as llama-perplexity does.

    n_chunks None: every whole chunk. bos_id: the model's BOS when it adds one (it replaces each chunk's
    first id), else None."""
    if n_ctx < 4 or n_ctx % 2:
        raise ValueError(f"the context must be an even number of at least 4 tokens, got {n_ctx}")
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"the text tokenizes to {len(tokens)} ids; a context of {n_ctx} needs at least "
                         f"{2 * n_ctx} (llama-perplexity's rule): give a longer text or a smaller --ctx")
    most = len(tokens) // n_ctx
    n = most if n_chunks is None else n_chunks
    if not 1 <= n <= most:
        raise ValueError(f"--chunks {n_chunks}: the text holds {most} chunks of {n_ctx} ids")
    targets = torch.tensor(tokens[: n * n_ctx], dtype=torch.long).view(n, n_ctx)   # [N, C]
    ids = targets.clone()
    if bos_id is not None:
        ids[:, 0] = bos_id
    return Chunks(ids=ids, targets=targets)


def model_logits(model, kv_dtype: torch.dtype = torch.float32) -> LogitsFn:
    """A speczoo model's logits of a chunk's scored rows: one forward of the chunk from an empty cache (its
    keys and values stored as kv_dtype)."""
    def run(ids: Tensor) -> Tensor:
        c = ids.shape[0]
        cache = KVCache(model.args, c, extra=0, dtype=kv_dtype)
        with torch.inference_mode():
            return model(ids, torch.arange(c), cache, readout=Readout(logit_rows=slice(c // 2, c - 1))).logits.float()
    return run


@dataclass
class Reference:
    """A reference run's scored positions, in order: argmax [P] and log-probabilities [P, V] (float32, a
    file mapped into memory)."""

    top1: Tensor
    logp: np.ndarray


@dataclass
class PplScore:
    positions: int
    nll: float                    # mean negative log-likelihood (nats)
    top1_agree: int | None = None  # positions whose argmax equals the reference's (None: no reference)
    kl: float | None = None       # mean KL(reference || model)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)

    @property
    def agreement(self) -> float | None:
        return None if self.top1_agree is None else self.top1_agree / self.positions


def evaluate(logits: LogitsFn, chunks: Chunks, reference: Reference | None = None, keep: Path | None = None,
             log: Callable[[str], None] | None = None) -> tuple[PplScore, Reference | None]:
    """Score every chunk; with `reference`, the agreement with it too. keep: a file to keep this run in, as
    the Reference returned for later runs."""
    nll_sum, agree, kl_sum = 0.0, 0, 0.0
    tops = []
    p = chunks.scored_per_chunk
    kept = None
    for i, (ids, target) in enumerate(zip(chunks.ids, chunks.scored_targets())):
        logp = torch.log_softmax(logits(ids).double(), dim=-1)            # [P, V]
        if logp.shape[0] != p:
            raise ValueError(f"the logits function gave {logp.shape[0]} rows for a chunk; {p} are scored")
        nll_sum += float(-logp.gather(1, target[:, None]).sum())
        top = logp.argmax(-1)                                               # [P]
        if reference is not None:
            ref_top = reference.top1[i * p:(i + 1) * p]
            ref_logp = torch.from_numpy(np.asarray(reference.logp[i * p:(i + 1) * p])).double()   # [P, V]
            agree += int((top == ref_top).sum())
            kl_sum += float((ref_logp.exp() * (ref_logp - logp)).sum())
        if keep is not None:
            if kept is None:
                kept = np.lib.format.open_memmap(keep, mode="w+", dtype=np.float32,
                                                 shape=(chunks.positions, logp.shape[1]))
            tops.append(top)
            kept[i * p:(i + 1) * p] = logp.clamp(min=-1e4).float().numpy()   # exp() of the floor is 0, never NaN
        if log is not None:
            log(f"chunk {i + 1}/{chunks.ids.shape[0]}: running ppl {math.exp(nll_sum / ((i + 1) * p)):.4f}")
    n = chunks.positions
    score = PplScore(positions=n, nll=nll_sum / n, top1_agree=agree if reference is not None else None,
                     kl=kl_sum / n if reference is not None else None)
    if kept is not None:
        kept.flush()
    return score, (Reference(top1=torch.cat(tops), logp=kept) if kept is not None else None)
