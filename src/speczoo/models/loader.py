"""Turn a bundle on disk (or tensors in memory) into a model of its architecture (models/registry.py).

A bundle holds config.json (ModelArgs), weights-<backend>.safetensors for the backend whose packing was
stored at pull time (keys "<tensor name>.<part>") and unpacked.safetensors: every tensor a backend does
not pack (the embedding, norms, biases) in its source's encoding, which `read_unpacked` decodes to the
exact fp32 values the source dequantizes to (a loaded model keeps its embedding so encoded, in the file,
and reads and decodes the rows it looks up: models/embedding.py). An older bundle holds weights.safetensors instead
(every tensor in fp32, GGUF names, torch [out, in] orientation), which is read as it is. The fp32 reference a
backend without a stored packing needs is not in a lean bundle: the caller passes `reference`, a callable
that builds it (speczoo.zoo.weights does, from the bundle's source). A tied LM head whose packing is
cheap to make (q8) is not stored either: it is packed at load from the embedding (`with_tied_head`).
Files are memory-mapped where they can be, a packing as one mapping (models/mapped.py) so that the parts a
model joins at load (q|k|v, gate|up), stored end to end, stay views of it. This module never picks a backend or an architecture silently, and never reads a source model
itself: an unknown name, a missing file or a missing reference is an error that says what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor, nn

from speczoo.kernels.backends import get_backend
from speczoo.kernels.linear import LinearBackend
from speczoo.kernels.pack import PACK_LAYOUT, concat_rows
from speczoo.models.args import ModelArgs
from speczoo.models.embedding import EncodedEmbedding, RowDecoder
from speczoo.models.file_rows import FileRows
from speczoo.models.gguf_blocks import BLOCK_BYTES, BLOCK_VALUES, TORCH_TYPES, decode
from speczoo.models.mapped import read_mapped
from speczoo.models.registry import LINEAR_WEIGHT_PATTERN, arch_class

CONFIG_FILE = "config.json"
LEGACY_WEIGHTS_FILE = "weights.safetensors"     # bundles before the lean format: every tensor in fp32
UNPACKED_FILE = "unpacked.safetensors"          # lean bundles: the tensors no backend packs
ENCODINGS_KEY = "encodings"                     # unpacked.safetensors metadata: name -> GGUF block type
_DEQUANT_ROWS = 1024                            # rows of GGUF blocks gguf's decoder takes per task
_DECODE_CHUNK = 1 << 16                         # values the torch decoders make at a time (they stay in cache)
_FEW_ROWS = 8     # block rows gguf's numpy decodes faster than the torch decoders' dozens of small operations
_HEAD_ROWS = 1024                               # rows of a tied head decoded and packed at a time at load
ROW_LOOKUP = ("token_embd.weight",)             # read by the model only row by row: kept encoded at load


def packed_weights_file(backend: str) -> str:
    return f"weights-{backend}.safetensors"


def linear_weight_sources(tensor_names: Iterable[str]) -> dict[str, str]:
    """Packed name -> name of the fp32 tensor it is packed from, for every linear weight of a model.

    The LM head is always packed as "output.weight": from output.weight, or from token_embd.weight when
    the model ties it to the embedding.
    """
    names = set(tensor_names)
    out = {n: n for n in sorted(names) if LINEAR_WEIGHT_PATTERN.match(n) and n != "token_embd.weight"}
    if "output.weight" not in names:
        if "token_embd.weight" not in names:
            raise KeyError("the model has neither output.weight nor token_embd.weight; the bundle is broken")
        out["output.weight"] = "token_embd.weight"
    return out


def stored_linear_sources(tensor_names: Iterable[str], backend: LinearBackend) -> dict[str, str]:
    """The part of `linear_weight_sources` a bundle stores for `backend`: all of it, except a tied LM head
    when the backend's packing is cheap (`cheap_pack`); that one is packed at load from the embedding the
    bundle keeps anyway (`with_tied_head`), the same bytes."""
    sources = linear_weight_sources(tensor_names)
    if backend.cheap_pack and sources["output.weight"] == "token_embd.weight":
        del sources["output.weight"]
    return sources


def with_tied_head(packed: dict[str, Tensor], tensors: Mapping[str, Tensor | EncodedEmbedding],
                   backend: LinearBackend) -> dict[str, Tensor]:
    """A stored packing with the LM head added when the bundle left it to the load (see
    `stored_linear_sources`): the backend packs the embedding now, as the pull would have. A bundle that
    stored its head (pulled before, or by a backend that packs slowly) is returned as it is."""
    if "output.weight" in tensors or any(k.startswith("output.weight.") for k in packed) or not backend.cheap_pack:
        return packed
    embed = tensors["token_embd.weight"]                               # [V, D] fp32, or stored rows
    if isinstance(embed, Tensor):
        head = backend.pack(embed)
    else:                                                              # decoded and packed a block of rows at a time
        v = embed.shape[0]
        head = concat_rows([backend.pack(embed[torch.arange(r0, min(v, r0 + _HEAD_ROWS))])
                            for r0 in range(0, v, _HEAD_ROWS)])
    return {**packed, **{f"output.weight.{part}": t for part, t in head.items()}}


def unpacked_names(tensor_names: Iterable[str]) -> list[str]:
    """The tensors a backend does not pack (kept in unpacked.safetensors): all but the linear weights."""
    names = list(tensor_names)
    packed = linear_weight_sources(names)
    return [n for n in names if n not in packed]


def build_model(args: ModelArgs, tensors: Mapping[str, Tensor], backend: str = "fp32",
                packed: Mapping[str, Tensor] | None = None) -> nn.Module:
    """A model of args.arch whose linear layers use `backend` (packed now unless `packed` is given)."""
    model = arch_class(args.arch)(args, tensors, get_backend(backend), packed)
    model.eval()
    return model


# ---------------------------------------------------------------- GGUF blocks -> fp32

def dequantize(raw: np.ndarray | Tensor, type_name: str) -> Tensor:
    """The fp32 values of GGUF data `raw` of block type `type_name` ("F32", "Q4_K", ...), as a tensor.

    Exactly the values of gguf.quants.dequantize. The types models/gguf_blocks.py decodes in torch go
    through it a chunk of rows at a time (its temporaries stay in cache), but for a few rows of quantized
    blocks (a decode step's embedding lookup: _FEW_ROWS at most), where gguf's numpy takes a quarter of the
    time; any other type runs gguf's own block decoder on chunks of rows on several threads (numpy releases
    the GIL). Each block is decoded on its own, so chunking changes no bit.
    """
    if isinstance(raw, Tensor):
        t = raw
    else:                                   # own memory: a GGUF's memory map is read-only
        t = torch.from_numpy(np.array(raw, order="C", copy=True))
    if type_name == "F32":
        return t.view(torch.float32)
    t = t.view(torch.uint8)
    few = t.dim() >= 2 and t.numel() <= _FEW_ROWS * t.shape[-1] and type_name not in ("F16", "BF16")
    if type_name in TORCH_TYPES and not few:
        return _torch_dequantize(t, type_name)
    return gguf_dequantize(t.numpy(), type_name)


def _torch_dequantize(raw: Tensor, type_name: str) -> Tensor:
    rows = raw.reshape(-1, raw.shape[-1])                                       # [N, R] uint8
    width = rows.shape[1] // BLOCK_BYTES[type_name] * BLOCK_VALUES[type_name]
    out = torch.empty(rows.shape[0], width, dtype=torch.float32)
    step = max(1, _DECODE_CHUNK // max(1, width))
    for r0 in range(0, rows.shape[0], step):
        out[r0:r0 + step] = decode(rows[r0:r0 + step], type_name)
    return out.reshape(*raw.shape[:-1], width)


def gguf_dequantize(raw: np.ndarray, type_name: str) -> Tensor:
    """gguf's own block decoder on `raw` (threaded over chunks of rows): the values `dequantize` equals."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    decoder = getattr(gguf.quants, type_name, None)
    rows = raw.reshape(-1, raw.shape[-1])
    if decoder is None or not hasattr(decoder, "dequantize_rows") or rows.shape[0] <= _DEQUANT_ROWS:
        out = np.array(gguf.quants.dequantize(raw, qtype), dtype=np.float32, order="C", copy=True)
        return torch.from_numpy(out)
    decoder.init_grid()
    shape = gguf.quants.quant_shape_from_byte_shape(raw.shape, qtype)
    out = np.empty((rows.shape[0], shape[-1]), dtype=np.float32)

    def chunk(r0: int) -> None:
        out[r0:r0 + _DEQUANT_ROWS] = decoder.dequantize_rows(rows[r0:r0 + _DEQUANT_ROWS])

    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        list(pool.map(chunk, range(0, rows.shape[0], _DEQUANT_ROWS)))
    return torch.from_numpy(out.reshape(shape))


def row_decoder(encoding: str | None) -> RowDecoder:
    """Stored rows [N, R] -> their fp32 values [N, D]: `dequantize` for GGUF blocks of `encoding`, a widening
    for a float tensor (encoding None). The whole-tensor decode of `read_unpacked` is this on every row."""
    if encoding is None:
        return lambda rows: rows.float()
    return lambda rows: dequantize(rows, encoding)


def read_unpacked(path: Path, names: Iterable[str] | None = None,
                  encoded: Iterable[str] = ()) -> dict[str, Tensor | EncodedEmbedding]:
    """The fp32 tensors of an unpacked.safetensors file (all, or `names`): GGUF blocks are dequantized,
    float tensors widened (exact either way). A tensor named in `encoded` whose file copy is not fp32
    comes back as an EncodedEmbedding instead: its stored rows, read from the file when looked up (FileRows)."""
    keep = set(encoded)
    with safe_open(str(path), framework="pt") as f:
        encodings = json.loads((f.metadata() or {}).get(ENCODINGS_KEY, "{}"))
        keys = list(f.keys())
        out: dict[str, Tensor | EncodedEmbedding] = {}
        for name in keys if names is None else [n for n in names if n in keys]:
            decode = row_decoder(encodings.get(name))
            if name in keep and f.get_slice(name).get_dtype() != "F32":
                out[name] = EncodedEmbedding(FileRows(path, name), decode)
            else:
                out[name] = decode(f.get_tensor(name))  # memory-mapped
    return out


# ---------------------------------------------------------------- bundles

def load_model(bundle_dir: Path, backend: str = "fp32",
               reference: Callable[[], Mapping[str, Tensor]] | None = None) -> nn.Module:
    """Load a pulled bundle and build it with `backend`.

    A stored backend reads its packing and the unpacked tensors (or, in an older bundle, the fp32 file);
    any other backend packs the fp32 reference now: the older bundle's file, else `reference()`.
    """
    bundle_dir = Path(bundle_dir)
    config = bundle_dir / CONFIG_FILE
    if not config.is_file():
        raise FileNotFoundError(f"{config} is missing: {bundle_dir} is not a complete bundle; re-pull the model")
    args = ModelArgs.from_json(config)
    impl = get_backend(backend)
    legacy = bundle_dir / LEGACY_WEIGHTS_FILE
    unpacked = bundle_dir / UNPACKED_FILE
    if not legacy.is_file() and not unpacked.is_file():
        raise FileNotFoundError(f"{bundle_dir} has neither {UNPACKED_FILE} nor {LEGACY_WEIGHTS_FILE}: it is not a "
                                "complete bundle; re-pull the model (speczoo pull NAME --force)")
    if not impl.stored:
        if legacy.is_file():
            return build_model(args, load_file(legacy), backend)       # memory-mapped, zero-copy
        if reference is None:
            raise ValueError(f"backend {impl.name!r} needs fp32 weights, which the bundle {bundle_dir.name} does "
                             "not keep; load it through speczoo.zoo.weights.load_model, which rebuilds them "
                             "from the model's source")
        return build_model(args, reference(), backend)
    packed_file = bundle_dir / packed_weights_file(impl.name)
    if not packed_file.is_file():
        raise FileNotFoundError(
            f"{packed_file} is missing: backend {impl.name!r} stores its packing at pull time and this "
            f"bundle was pulled without it; re-pull with that backend or choose another")
    _check_layout(packed_file)
    tensors = load_file(legacy) if legacy.is_file() else read_unpacked(unpacked, encoded=ROW_LOOKUP)
    return build_model(args, tensors, backend, with_tied_head(read_mapped(packed_file), tensors, impl))


def _check_layout(packed_file: Path) -> None:
    """Refuse a stored packing in a layout newer than this speczoo reads (it would compute garbage)."""
    with safe_open(str(packed_file), framework="pt") as f:
        stamp = (f.metadata() or {}).get("layout", "1")
    layout = int(stamp) if stamp.isdigit() else None
    if layout is None or layout > PACK_LAYOUT:
        raise ValueError(f"{packed_file} is packed in layout {stamp!r}, and this speczoo reads layouts 1..{PACK_LAYOUT}: "
                         f"upgrade speczoo, or re-pack the model with this one (speczoo pull NAME --force)")
