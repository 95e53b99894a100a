"""GGUFMeta: what an architecture file reads from a GGUF to make its ModelArgs, and the fields every one reads.

A GGUF names its hyper-parameters `<arch>.<key>` (llama.block_count, gemma2.attn_logit_softcapping, ...)
and its tokenizer `tokenizer.ggml.<key>`. The zoo opens the file and hands the architecture a GGUFMeta
(zoo/gguf.py) with `common`, the fields read the same way for every architecture (sizes, heads, norm
epsilon, RoPE base, tied head, special ids); the architecture's `args_from_gguf` adds its own. Plain data
and lookups only: this module never opens a file and never knows an architecture by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GGUFMeta:
    arch: str                                    # general.architecture
    field: Callable[[str], Any]                  # full key -> its value, or None when the file lacks it
    tensor_shapes: Mapping[str, tuple[int, ...]]  # GGUF tensor name -> torch shape ([out, in] for a matrix)
    common: Mapping[str, Any]                    # the ModelArgs fields every architecture reads the same way

    def get(self, key: str, default: Any = None) -> Any:
        """The architecture's own key `<arch>.<key>` (default when absent)."""
        v = self.field(f"{self.arch}.{key}")
        return default if v is None else v

    def require(self, key: str) -> Any:
        v = self.field(f"{self.arch}.{key}")
        if v is None:
            raise ValueError(f"GGUF metadata lacks {self.arch}.{key!r}; this file cannot be converted "
                             "(is it a complete model?)")
        return v

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_shapes

    def refuse_rope_scaling(self) -> None:
        """For an architecture that runs no RoPE scaling: a file that asks for one is an error."""
        kind = self.get("rope.scaling.type")
        if kind not in (None, "none") and float(self.get("rope.scaling.factor", 1.0)) != 1.0:
            raise ValueError(f"RoPE scaling {kind!r} is not supported for {self.arch}; this model would run "
                             "incorrectly")

    def sliding_pattern(self, default: int, n_layers: int) -> int:
        """The period N of `attention.sliding_window_pattern` (every Nth layer global), from an int or a
        per-layer list of "is sliding" flags; `default` when the file has none."""
        value = self.get("attention.sliding_window_pattern", default)
        if not isinstance(value, list):
            return int(value)
        flags = [bool(v) for v in value]
        for n in range(1, n_layers + 1):
            if flags == [(i + 1) % n != 0 for i in range(len(flags))]:
                return n
        raise ValueError(f"per-layer sliding-window pattern {flags} is not periodic (every Nth layer global); "
                         "speczoo cannot run this layout")
