"""Every architecture speczoo runs, by its GGUF name: the one list the loader, the zoo and the CLI ask.

Adding an architecture is a file in models/ (a `decoder.Decoder` subclass: its GGUF tensor names, its
metadata -> ModelArgs, any exact source transform) and one line in ARCHS below (docs/architecture.md).
The names of the tensors a backend packs come from the architectures' layouts: a GGUF tensor name means
the same kind of tensor in every architecture (llama.cpp's one table of names), so their union is one
pattern. This module never builds a model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from speczoo.models.decoder import Decoder
from speczoo.models.gemma2 import Gemma2
from speczoo.models.gemma3 import Gemma3
from speczoo.models.lfm2 import Lfm2
from speczoo.models.llama import Llama
from speczoo.models.phi3 import Phi3
from speczoo.models.qwen2 import Qwen2
from speczoo.models.qwen3 import Qwen3

ARCHS: dict[str, type[Decoder]] = {cls.ARCH: cls for cls in (
    Qwen2,
    Qwen3,
    Llama,
    Phi3,
    Gemma2,
    Gemma3,
    Lfm2,
)}
SUPPORTED_ARCHS: tuple[str, ...] = tuple(ARCHS)


def arch_class(name: str) -> type[Decoder]:
    """The model class of GGUF architecture `name`; an unknown one is an error naming those speczoo runs."""
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"architecture {name!r} is not supported; speczoo runs "
                         f"{', '.join(SUPPORTED_ARCHS)}") from None


_BLOCK_LINEARS = sorted({name for cls in ARCHS.values() for name in cls.linear_weights()})

# Tensor names that are linear-layer weights (packed by a backend). token_embd.weight is one only when
# the model has no output.weight (tied LM head); it is then packed under the name "output.weight".
LINEAR_WEIGHT_PATTERN = re.compile(
    rf"^(blk\.\d+\.({'|'.join(map(re.escape, _BLOCK_LINEARS))})\.weight|output\.weight|token_embd\.weight)$")

# The linears a block reads from one input and joins at load (kernels/fused.py FusedLinears: one call for
# q|k|v, one for gate|up), in the order it joins them, over every architecture with separate tensors.
_JOINED = sorted({names for cls in ARCHS.values() for names in (cls.LAYOUT.qkv, cls.LAYOUT.gate_up)
                  if len(names) > 1})
_BLOCK_PREFIX = re.compile(r"^blk\.(\d+)\.")


def joined_linears(packed_names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Packed weight name ("blk.N.attn_q.weight") -> its block's group of names that a model joins at load,
    in join order, for every name in `packed_names` whose group has two or more members there. A bundle
    stores each group's packed parts end to end (zoo/layout.py), so that the join is a view, not a copy."""
    names = set(packed_names)
    out: dict[str, tuple[str, ...]] = {}
    blocks = {m.group(1) for n in names if (m := _BLOCK_PREFIX.match(n))}
    for b in sorted(blocks):
        for group in _JOINED:
            present = tuple(f"blk.{b}.{g}.weight" for g in group if f"blk.{b}.{g}.weight" in names)
            if len(present) > 1:
                out.update(dict.fromkeys(present, present))
    return out

