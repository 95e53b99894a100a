"""Turn a bundle on disk (or tensors in memory) into a model: the architecture registry and loading.

A bundle holds config.json (ModelArgs) and weights.safetensors (fp32, GGUF tensor names, torch [out, in]
orientation), plus weights-<backend>.safetensors for a backend whose packing is stored at pull time
(keys "<tensor name>.<part>"). Files are opened memory-mapped, so loading takes seconds and untouched
tensors never enter RAM. This module never picks a backend or an architecture silently: an unknown name
is an error that says what exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor, nn

from speczoo.kernels.linear import get_backend
from speczoo.kernels.pack import PACK_LAYOUT
from speczoo.models.args import ModelArgs
from speczoo.models.gemma3 import Gemma3
from speczoo.models.qwen2 import Qwen2

ARCHS: dict[str, type] = {"qwen2": Qwen2, "gemma3": Gemma3}

# Tensor names that are linear-layer weights (packed by a backend). token_embd.weight is one only when
# the model has no output.weight (tied LM head); it is then packed under the name "output.weight".
LINEAR_WEIGHT_PATTERN = re.compile(
    r"^(blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight|output\.weight"
    r"|token_embd\.weight)$")


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


def build_model(args: ModelArgs, tensors: Mapping[str, Tensor], backend: str = "fp32",
                packed: Mapping[str, Tensor] | None = None) -> nn.Module:
    """A model of args.arch whose linear layers use `backend` (packed now unless `packed` is given)."""
    try:
        cls = ARCHS[args.arch]
    except KeyError:
        raise ValueError(f"unsupported architecture {args.arch!r}; speczoo runs {sorted(ARCHS)}") from None
    model = cls(args, tensors, get_backend(backend), packed)
    model.eval()
    return model


def load_model(bundle_dir: Path, backend: str = "fp32") -> nn.Module:
    """Load a pulled bundle memory-mapped and build it with `backend`."""
    bundle_dir = Path(bundle_dir)
    config = bundle_dir / "config.json"
    weights = bundle_dir / "weights.safetensors"
    for f in (config, weights):
        if not f.is_file():
            raise FileNotFoundError(f"{f} is missing: {bundle_dir} is not a complete bundle; re-pull the model")
    args = ModelArgs.from_json(config)
    tensors = load_file(weights)          # memory-mapped, zero-copy
    impl = get_backend(backend)
    packed = None
    if impl.stored:
        packed_file = bundle_dir / f"weights-{impl.name}.safetensors"
        if not packed_file.is_file():
            raise FileNotFoundError(
                f"{packed_file} is missing: backend {impl.name!r} stores its packing at pull time and this "
                f"bundle was pulled without it; re-pull with that backend or choose another")
        _check_layout(packed_file)
        packed = load_file(packed_file)
    return build_model(args, tensors, backend, packed)


def _check_layout(packed_file: Path) -> None:
    """Refuse a stored packing in a layout newer than this speczoo reads (it would compute garbage)."""
    with safe_open(str(packed_file), framework="pt") as f:
        stamp = (f.metadata() or {}).get("layout", "1")
    layout = int(stamp) if stamp.isdigit() else None
    if layout is None or layout > PACK_LAYOUT:
        raise ValueError(f"{packed_file} is packed in layout {stamp!r}, and this speczoo reads layouts 1..{PACK_LAYOUT}: "
                         f"upgrade speczoo, or re-pack the model with this one (speczoo pull NAME --force)")
