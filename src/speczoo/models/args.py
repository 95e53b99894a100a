"""ModelArgs: the architecture hyper-parameters every model file and the zoo agree on.

Written by the zoo into a bundle's config.json (from GGUF metadata or an HF config.json) and read by
`models.loader`. Plain data only: no tensors, no torch here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass
class ModelArgs:
    arch: str                      # "qwen2" | "gemma3" (registry key in models.loader)
    vocab_size: int
    dim: int                       # hidden size D
    n_layers: int
    n_heads: int                   # query heads H
    n_kv_heads: int                # key/value heads (GQA)
    head_dim: int                  # per-head size Dh (gemma3: 256, not dim // n_heads)
    ffn_dim: int
    norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0        # base of global-attention layers
    rope_local_theta: float = 10_000.0     # base of sliding-window layers (gemma3)
    sliding_window: int = 0                # 0: no sliding-window layers
    sliding_pattern: int = 0               # gemma3: every Nth layer (1-based) is global; 0: all global
    qkv_bias: bool = False                 # qwen2: True
    qk_norm: bool = False                  # gemma3: RMSNorm on q and k per head
    sandwich_norms: bool = False           # gemma3: post-attention and post-ffn norms too
    act: str = "silu"                      # "silu" | "gelu_tanh"
    embed_scale: float = 1.0               # gemma3: sqrt(dim)
    query_scale: float = 0.0               # 0: 1/sqrt(head_dim)
    final_logit_softcap: float = 0.0       # 0: none
    tie_embeddings: bool = True            # LM head = token embedding when no output weight exists
    context_length: int = 32768
    bos_id: int | None = None
    eos_ids: list[int] = field(default_factory=list)

    def layer_is_sliding(self, layer: int) -> bool:
        """True when layer `layer` (0-based) attends only to the last `sliding_window` positions."""
        if self.sliding_window <= 0 or self.sliding_pattern <= 0:
            return False
        return (layer + 1) % self.sliding_pattern != 0

    def to_json(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def from_dict(cls, d: dict) -> ModelArgs:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"config.json has unknown ModelArgs fields {sorted(unknown)}; "
                             "the bundle was written by a newer speczoo: re-pull it")
        return cls(**d)

    @classmethod
    def from_json(cls, path: Path) -> ModelArgs:
        return cls.from_dict(json.loads(Path(path).read_text()))
