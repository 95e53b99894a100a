"""The EAGLE-3 head's hyper-parameters and their speculators-format `config.json`.

The speculators library (vllm-project/speculators) defines the on-disk format vLLM and SGLang load
EAGLE-3 heads from: an HF-style config.json with `speculators_model_type: "eagle3"`, a Llama
`transformer_layer_config` for the head's one decoder layer, `draft_vocab_size`, the target layers the
features come from (`eagle_aux_hidden_state_layer_ids`) and a `speculators_config` naming the verifier
(the target) and the proposal method. This module converts between that JSON and `HeadConfig`; it
holds no tensors and never reads weights.

Layer ids follow vLLM's convention: id i is the hidden state *entering* target layer i, which is the
residual stream after layer i - 1 — what speczoo's forward returns for `hidden_layers=[i - 1]`
(`HeadConfig.target_layers`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SPECULATORS_VERSION = "0.1.0"


@dataclass(frozen=True)
class HeadConfig:
    target: str                     # the verifier: zoo name (or path) of the target model
    hidden_size: int                # D of the head and of the target's residual stream
    n_heads: int                    # H of the head's attention
    n_kv_heads: int
    head_dim: int                   # Dh
    ffn_dim: int                    # the head's MLP width
    target_vocab: int               # V of the target (the embedding table the head reads)
    draft_vocab: int                # Vd: rows of the head's LM head
    aux_layer_ids: tuple[int, int, int]   # vLLM ids: hidden state entering these target layers
    norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_positions: int = 32768
    speculative_tokens: int = 3     # training-time-test depth the head was trained for

    def __post_init__(self):
        if len(self.aux_layer_ids) != 3 or any(i < 1 for i in self.aux_layer_ids):
            raise ValueError(f"an EAGLE-3 head reads three target layers with ids >= 1 (id i: the hidden "
                             f"state entering layer i); got {self.aux_layer_ids}")
        if not 0 < self.draft_vocab <= self.target_vocab:
            raise ValueError(f"draft_vocab must be in 1..{self.target_vocab} (the target's), got {self.draft_vocab}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")

    @property
    def target_layers(self) -> tuple[int, ...]:
        """The layer indices to pass as the target forward's `hidden_layers` (residual after layer i)."""
        return tuple(i - 1 for i in self.aux_layer_ids)

    # -- speculators config.json ------------------------------------------------------------
    def to_speculators(self) -> dict:
        layer = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.ffn_dim,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_positions,
            "vocab_size": self.target_vocab,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
        }
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION,
            "transformer_layer_config": layer,
            "draft_vocab_size": self.draft_vocab,
            "norm_before_residual": False,
            "target_hidden_size": self.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "embed_requires_grad": False,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": self.speculative_tokens,
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"name_or_path": self.target, "architectures": []},
            },
            "torch_dtype": "float32",
        }

    @classmethod
    def from_speculators(cls, d: dict) -> HeadConfig:
        kind = d.get("speculators_model_type")
        if kind != "eagle3":
            raise ValueError(f"not an EAGLE-3 speculators config: speculators_model_type is {kind!r}, "
                             "expected 'eagle3'")
        layer = d["transformer_layer_config"]
        if layer.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"speczoo runs EAGLE-3 heads with one decoder layer; this one has "
                             f"{layer['num_hidden_layers']}")
        if d.get("norm_before_residual", False) or d.get("norm_before_fc", False):
            raise ValueError("this head uses norm_before_residual / norm_before_fc, which speczoo does not run")
        hidden = layer["hidden_size"]
        target_hidden = d.get("target_hidden_size") or hidden
        if target_hidden != hidden:
            raise ValueError(f"the head's hidden size ({hidden}) differs from its target's ({target_hidden}); "
                             "speczoo runs heads as wide as their target")
        ids = d.get("eagle_aux_hidden_state_layer_ids")
        if not ids:
            raise ValueError("config.json lacks eagle_aux_hidden_state_layer_ids: which target layers feed the head")
        spec = d.get("speculators_config", {})
        methods = spec.get("proposal_methods") or [{}]
        return cls(
            target=spec.get("verifier", {}).get("name_or_path") or "",
            hidden_size=hidden,
            n_heads=layer["num_attention_heads"],
            n_kv_heads=layer.get("num_key_value_heads", layer["num_attention_heads"]),
            head_dim=layer.get("head_dim") or hidden // layer["num_attention_heads"],
            ffn_dim=layer["intermediate_size"],
            target_vocab=layer["vocab_size"],
            draft_vocab=d["draft_vocab_size"],
            aux_layer_ids=tuple(int(i) for i in ids),
            norm_eps=layer.get("rms_norm_eps", 1e-6),
            rope_theta=layer.get("rope_theta", 10_000.0),
            max_positions=layer.get("max_position_embeddings", 32768),
            speculative_tokens=methods[0].get("speculative_tokens", 3),
        )

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_speculators(), indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> HeadConfig:
        return cls.from_speculators(json.loads(Path(path).read_text()))


def default_aux_layer_ids(n_layers: int) -> tuple[int, int, int]:
    """Low, middle and high feature layers as vLLM picks them (2, L // 2, L - 3), squeezed into 1..L-1
    for shallow (test) models."""
    if n_layers < 2:
        raise ValueError(f"an EAGLE-3 head needs a target of at least 2 layers, got {n_layers}")
    if n_layers >= 8:
        return (2, n_layers // 2, n_layers - 3)
    return (1, max(1, n_layers // 2), n_layers - 1)


def head_config_for(target_name: str, args, draft_vocab: int, ffn_dim: int | None = None,
                    speculative_tokens: int = 3) -> HeadConfig:
    """A head shaped for target ModelArgs `args`: the target's width, heads and MLP (EAGLE-3's default)."""
    return HeadConfig(
        target=target_name, hidden_size=args.dim, n_heads=args.n_heads, n_kv_heads=args.n_kv_heads,
        head_dim=args.head_dim, ffn_dim=ffn_dim or args.ffn_dim, target_vocab=args.vocab_size,
        draft_vocab=min(draft_vocab, args.vocab_size), aux_layer_ids=default_aux_layer_ids(args.n_layers),
        norm_eps=args.norm_eps, rope_theta=args.rope_theta, speculative_tokens=speculative_tokens)
