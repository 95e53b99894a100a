"""GGUF -> ModelArgs and fp32 tensors, through the `gguf` package's reader and dequantizer.

Called by `speczoo pull` (to write a bundle), by the fp32 reference a lean bundle rebuilds on demand
(speczoo.zoo.weights) and by `speczoo check` (to build a model straight from a .gguf file). Tensors come
out one at a time in torch [out, in] orientation under their GGUF names, either dequantized to fp32 or as
the file's own blocks: the 1.5B target is 7 GB in fp32, so this module must never hold all of them at
once. The fields every architecture shares are read here; the rest, and whatever llama.cpp hardcodes per
architecture, by the architecture's file (models/registry.py), which also says in which row order the
model reads a tensor (llama's q/k un-permuted, exactly). Anything we cannot run faithfully (an unknown
arch, an unsupported RoPE scaling, partial RoPE, experts) is an error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from speczoo.models.args import ModelArgs
from speczoo.models.loader import LINEAR_WEIGHT_PATTERN, dequantize, linear_weight_sources
from speczoo.models.meta import GGUFMeta
from speczoo.models.registry import SUPPORTED_ARCHS, arch_class
from speczoo.zoo.gguf_file import CorruptGGUFError, open_gguf

__all__ = ["LINEAR_WEIGHT_PATTERN", "linear_weight_sources", "gguf_model_args", "iter_gguf_tensors",
           "iter_gguf_blocks", "gguf_quant_summary", "open_gguf", "SUPPORTED_ARCHS", "CorruptGGUFError"]

# Token texts that end a turn (llama.cpp treats them as end-of-generation too).
_EOG_TEXTS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|end_of_text|>", "<eos>")


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


def gguf_model_args(reader) -> ModelArgs:
    """ModelArgs from a GGUF's metadata: the fields every architecture shares read here, the rest by the
    architecture's own file (models/registry.py); an architecture speczoo does not run is an error naming
    those it does."""
    arch = _require(reader, "general.architecture")
    cls = arch_class(arch)

    def a(key: str, default=None):
        return _field(reader, f"{arch}.{key}", default)

    dim = int(_require(reader, f"{arch}.embedding_length"))
    n_heads = int(_require(reader, f"{arch}.attention.head_count"))
    per_layer = a("attention.head_count_kv", n_heads)
    n_kv = per_layer
    if isinstance(per_layer, list):          # a hybrid's (lfm2): 0 where a layer has no attention
        heads = {int(n) for n in per_layer} - {0}
        if len(heads) != 1:
            raise ValueError(f"per-layer head_count_kv {per_layer} is not supported (one count for every attention "
                             "layer, 0 for layers without attention)")
        n_kv = heads.pop()
    head_dim = int(a("attention.key_length", dim // n_heads))
    if int(a("attention.value_length", head_dim)) != head_dim:
        raise ValueError("GGUF has value_length != key_length; speczoo's attention needs them equal")
    if int(a("rope.dimension_count", head_dim)) != head_dim:
        raise ValueError(f"the file rotates {a('rope.dimension_count')} of each head's {head_dim} dimensions (partial "
                         "RoPE, e.g. Phi-4-mini); speczoo rotates whole heads only and would run it incorrectly")
    if int(a("expert_count", 0) or 0) > 0:
        raise ValueError(f"this {arch} file is a mixture of experts ({a('expert_count')} experts, e.g. Mixtral); "
                         "speczoo runs dense models only")
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}   # torch order
    vocab = shapes.get("token_embd.weight")
    if vocab is None:
        raise ValueError("GGUF has no token_embd.weight")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
    common = dict(
        arch=arch, vocab_size=vocab[0], dim=dim, n_layers=int(_require(reader, f"{arch}.block_count")),
        n_heads=n_heads, n_kv_heads=int(n_kv), head_dim=head_dim,
        ffn_dim=int(_require(reader, f"{arch}.feed_forward_length")),
        norm_eps=float(a("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(a("rope.freq_base", 10_000.0)),
        tie_embeddings="output.weight" not in shapes,
        context_length=int(a("context_length", 32768)),
        bos_id=int(bos) if (bos is not None and add_bos) else None,
        eos_ids=_eos_ids(reader),
    )
    args = cls.args_from_gguf(GGUFMeta(arch, lambda key: _field(reader, key), shapes, common))
    if isinstance(per_layer, list) and [i for i, n in enumerate(per_layer) if int(n) == 0] != args.conv_layers:
        raise ValueError(f"this {arch} file has layers without attention (head_count_kv {per_layer}), which "
                         f"speczoo runs only for hybrid architectures (lfm2)")
    return args


def _source_rows(reader) -> Callable[[str, int], Tensor | None]:
    """name, row count -> the row order the model reads the tensor in (None: the file's), by the file's
    architecture (llama: q/k un-permuted)."""
    args = gguf_model_args(reader)
    cls = arch_class(args.arch)
    return lambda name, n_rows: cls.source_rows(name, n_rows, args)


def _in_model_order(data: np.ndarray, name: str, kind: str, order: Tensor | None) -> np.ndarray:
    """The file's rows of one tensor (fp32 [out, in], or blocks [out, bytes]) in the model's row order."""
    if order is None:
        return data
    if data.ndim == 1 and kind != "F32":
        raise ValueError(f"{name} is a quantized vector ({kind}); its rows cannot be reordered")
    return data[order.numpy()]


def iter_gguf_tensors(reader, names: set[str] | None = None) -> Iterator[tuple[str, Tensor]]:
    """(GGUF name, fp32 tensor in torch [out, in] orientation), one at a time, in file order; only those
    in `names` when given. The values are gguf.quants.dequantize's, bit for bit, in the row order the
    model reads (the architecture's `source_rows`: llama's q/k un-permuted)."""
    rows = _source_rows(reader)
    for t in reader.tensors:
        if names is None or t.name in names:
            kind = t.tensor_type.name
            data = _in_model_order(t.data, t.name, kind, rows(t.name, int(t.data.shape[0])))
            yield t.name, dequantize(data, kind)                      # [out, in] (or [n]), own memory


def iter_gguf_blocks(reader, names: set[str] | None = None) -> Iterator[tuple[str, str, Tensor]]:
    """(GGUF name, block type, the file's data as a tensor): F32 data as fp32 [out, in], any other type as
    its raw bytes (uint8 [..., bytes per row]) for `dequantize` to decode later, rows in the model's order
    as `iter_gguf_tensors`. Copies, not the mmap."""
    rows = _source_rows(reader)
    for t in reader.tensors:
        if names is None or t.name in names:
            kind = t.tensor_type.name
            data = np.array(_in_model_order(t.data, t.name, kind, rows(t.name, int(t.data.shape[0]))),
                            order="C", copy=True)
            yield t.name, kind, torch.from_numpy(data if kind == "F32" else data.view(np.uint8))


def gguf_quant_summary(reader) -> dict[str, int]:
    """Tensor type name (F32, Q4_K, ...) -> how many tensors of that type the file holds."""
    return dict(sorted(Counter(t.tensor_type.name for t in reader.tensors).items()))
