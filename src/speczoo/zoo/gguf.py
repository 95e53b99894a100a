"""GGUF -> ModelArgs and fp32 tensors, through the `gguf` package's reader and dequantizer.

Called by `speczoo pull` (to write a bundle), by the fp32 reference a lean bundle rebuilds on demand
(speczoo.zoo.weights) and by `speczoo check` (to build a model straight from a .gguf file). Tensors come
out one at a time in torch [out, in] orientation under their GGUF names, either dequantized to fp32 or as
the file's own blocks: the 1.5B target is 7 GB in fp32, so this module must never hold all of them at
once. Metadata llama.cpp hardcodes per architecture (gemma3's sliding pattern, local RoPE base, query
scale) is filled in here the way llama.cpp fills it; anything we cannot run faithfully (an unknown arch,
RoPE scaling) is an error.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from speczoo.errors import SpeczooError
from speczoo.models.args import ModelArgs
from speczoo.models.loader import LINEAR_WEIGHT_PATTERN, dequantize, linear_weight_sources

__all__ = ["LINEAR_WEIGHT_PATTERN", "linear_weight_sources", "gguf_model_args", "iter_gguf_tensors",
           "iter_gguf_blocks", "gguf_quant_summary", "open_gguf", "SUPPORTED_ARCHS"]

SUPPORTED_ARCHS = ("qwen2", "gemma3")


class CorruptGGUFError(SpeczooError):
    """A GGUF file that cannot be read: truncated, or not GGUF at all."""
# Token texts that end a turn (llama.cpp treats them as end-of-generation too).
_EOG_TEXTS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|end_of_text|>", "<eos>")


def open_gguf(path: Path):
    """A gguf.GGUFReader on `path` (memory-mapped), with a clear error when the file is absent, truncated or
    corrupt (gguf's reader fails on those with an IndexError or a numpy reshape message)."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(path)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, IndexError, KeyError, OverflowError, TypeError, UnicodeDecodeError) as exc:
        raise CorruptGGUFError(f"{path} ({size:,} bytes) is not a readable GGUF file: it is truncated or corrupt "
                               f"(gguf's reader says: {exc}). Download or copy it again and check its sha256 "
                               "against the publisher's") from exc
    if end > size:
        raise CorruptGGUFError(f"{path} is truncated: its tensors end at byte {end:,} and the file has {size:,}. "
                               "Download or copy it again")
    return reader


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def _require(reader, key: str):
    v = _field(reader, key)
    if v is None:
        raise ValueError(f"GGUF metadata lacks {key!r}; this file cannot be converted (is it a complete model?)")
    return v


def _tensor_rows(reader, name: str) -> int | None:
    for t in reader.tensors:
        if t.name == name:
            return int(t.shape[-1])      # GGUF shapes are [in, out]: ne[1] is the row count
    return None


def _eos_ids(reader) -> list[int]:
    ids = set()
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = _field(reader, key)
        if v is not None:
            ids.add(int(v))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if tokens:
        wanted = set(_EOG_TEXTS)
        ids.update(i for i, t in enumerate(tokens) if t in wanted)
    return sorted(ids)


def _sliding_pattern(value, n_layers: int) -> int:
    """gemma3's period N (every Nth layer global) from an int or a per-layer list of "is sliding" flags."""
    if not isinstance(value, list):
        return int(value)
    flags = [bool(v) for v in value]
    for n in range(1, n_layers + 1):
        if flags == [(i + 1) % n != 0 for i in range(len(flags))]:
            return n
    raise ValueError(f"per-layer sliding-window pattern {flags} is not periodic (every Nth layer global); "
                     "speczoo cannot run this layout")


def gguf_model_args(reader) -> ModelArgs:
    """ModelArgs from a GGUF's metadata (qwen2 and gemma3; anything else is a clear error)."""
    arch = _require(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; speczoo runs {list(SUPPORTED_ARCHS)}")

    def a(key: str, default=None):
        return _field(reader, f"{arch}.{key}", default)

    dim = int(_require(reader, f"{arch}.embedding_length"))
    n_heads = int(_require(reader, f"{arch}.attention.head_count"))
    n_kv = a("attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):
        raise ValueError("per-layer head_count_kv is not supported")
    head_dim = int(a("attention.key_length", dim // n_heads))
    if int(a("attention.value_length", head_dim)) != head_dim:
        raise ValueError("GGUF has value_length != key_length; speczoo's attention needs them equal")
    scaling = a("rope.scaling.type")
    if scaling not in (None, "none") and float(a("rope.scaling.factor", 1.0)) != 1.0:
        raise ValueError(f"RoPE scaling {scaling!r} is not supported yet; this model would run incorrectly")
    vocab = _tensor_rows(reader, "token_embd.weight")
    if vocab is None:
        raise ValueError("GGUF has no token_embd.weight")
    has_output = _tensor_rows(reader, "output.weight") is not None
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
    common = dict(
        arch=arch, vocab_size=vocab, dim=dim, n_layers=int(_require(reader, f"{arch}.block_count")),
        n_heads=n_heads, n_kv_heads=int(n_kv), head_dim=head_dim,
        ffn_dim=int(_require(reader, f"{arch}.feed_forward_length")),
        norm_eps=float(a("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(a("rope.freq_base", 10_000.0)),
        tie_embeddings=not has_output,
        context_length=int(a("context_length", 32768)),
        bos_id=int(bos) if (bos is not None and add_bos) else None,
        eos_ids=_eos_ids(reader),
    )
    if arch == "qwen2":
        return ModelArgs(**common, qkv_bias=True, act="silu")
    # gemma3: llama.cpp hardcodes the sliding pattern (every 6th layer global), local RoPE base 10000,
    # and the query scale 1/sqrt(head_dim) (the 27B, with 62 layers, uses dim / n_heads instead).
    n_layers = common["n_layers"]
    pre_attn = dim / n_heads if n_layers == 62 else head_dim
    return ModelArgs(
        **common,
        rope_local_theta=float(a("rope.freq_base_swa", 10_000.0)),
        sliding_window=int(a("attention.sliding_window", 0)),
        sliding_pattern=_sliding_pattern(a("attention.sliding_window_pattern", 6), n_layers),
        qk_norm=True, sandwich_norms=True, act="gelu_tanh", embed_scale=math.sqrt(dim),
        query_scale=1.0 / math.sqrt(pre_attn),
        final_logit_softcap=float(a("final_logit_softcapping", 0.0) or 0.0),
    )


def iter_gguf_tensors(reader, names: set[str] | None = None) -> Iterator[tuple[str, Tensor]]:
    """(GGUF name, fp32 tensor in torch [out, in] orientation), one at a time, in file order; only those
    in `names` when given. The values are gguf.quants.dequantize's, bit for bit."""
    for t in reader.tensors:
        if names is None or t.name in names:
            yield t.name, dequantize(t.data, t.tensor_type.name)   # [out, in] (or [n]), own memory


def iter_gguf_blocks(reader, names: set[str] | None = None) -> Iterator[tuple[str, str, Tensor]]:
    """(GGUF name, block type, the file's data as a tensor): F32 data as fp32 [out, in], any other type as
    its raw bytes (uint8 [..., bytes per row]) for `dequantize` to decode later. Copies, not the mmap."""
    for t in reader.tensors:
        if names is None or t.name in names:
            data = np.array(t.data, order="C", copy=True)
            kind = t.tensor_type.name
            yield t.name, kind, torch.from_numpy(data if kind == "F32" else data.view(np.uint8))


def gguf_quant_summary(reader) -> dict[str, int]:
    """Tensor type name (F32, Q4_K, ...) -> how many tensors of that type the file holds."""
    return dict(sorted(Counter(t.tensor_type.name for t in reader.tensors).items()))
