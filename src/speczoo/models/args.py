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
    arch: str                      # GGUF architecture name, the key of models.registry.ARCHS
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
    rope_scale: float = 1.0                # linear RoPE scaling: angles of position p are those of p / scale
    rope_attn_factor: float = 1.0          # phi3 LongRoPE: cos and sin multiplied by it (q and k both)
    rope_max_positions: int = 0            # phi3 LongRoPE: its short factors hold below this position; 0: no limit
    sliding_window: int = 0                # 0: no sliding-window layers
    sliding_pattern: int = 0               # every Nth layer (1-based) is global (gemma3: 6, gemma2: 2; phi3:
                                           # n_layers + 1, none global); 0: all global
    qkv_bias: bool = False                 # qwen2: True
    qk_norm: bool = False                  # gemma3: RMSNorm on q and k per head
    sandwich_norms: bool = False           # gemma3: post-attention and post-ffn norms too
    act: str = "silu"                      # "silu" | "gelu_tanh"
    embed_scale: float = 1.0               # gemma3: sqrt(dim)
    query_scale: float = 0.0               # 0: 1/sqrt(head_dim)
    attn_logit_softcap: float = 0.0        # gemma2: scores = cap * tanh(scores / cap) before the softmax; 0: none
    final_logit_softcap: float = 0.0       # 0: none
    tie_embeddings: bool = True            # LM head = token embedding when no output weight exists
    conv_layers: list[int] = field(default_factory=list)   # lfm2: the short-convolution layers (0-based), which
                                           # have no attention and no K/V; [] for a model of attention only
    conv_kernel: int = 0                   # lfm2: taps L of each short convolution (its state: the last L - 1 inputs)
    context_length: int = 32768
    bos_id: int | None = None
    eos_ids: list[int] = field(default_factory=list)

    def layer_is_sliding(self, layer: int) -> bool:
        """True when layer `layer` (0-based) attends only to the last `sliding_window` positions."""
        if self.sliding_window <= 0 or self.sliding_pattern <= 0:
            return False
        return (layer + 1) % self.sliding_pattern != 0

    @property
    def kv_layers(self) -> list[int]:
        """The layers with attention, whose keys and values a KV cache holds, in order."""
        conv = set(self.conv_layers)
        return [i for i in range(self.n_layers) if i not in conv]

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
