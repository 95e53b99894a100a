"""A local Hugging Face safetensors directory as a zoo source: config -> ModelArgs, tensors -> GGUF names.

speczoo's models read tensors under llama.cpp's GGUF names and value conventions, so an HF checkpoint is
renamed (model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight, ...) and, for Gemma, its
zero-centred RMSNorm weights are stored as w + 1 the way llama.cpp's converter stores them. Qwen2 and
Gemma 3 use NEOX-style RoPE in both worlds, so q/k need no permutation. Tensors are yielded one at a time
in fp32. An architecture, tensor or config field this module cannot map faithfully is an error, never
skipped.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from safetensors import safe_open
from tokenizers import Tokenizer as Backend
from torch import Tensor

from speczoo.models.args import ModelArgs
from speczoo.zoo.gguf_tokenizer import END_OF_TURN_TOKENS, tokenizer_config

HF_MODEL_TYPES = {"qwen2": "qwen2", "gemma3_text": "gemma3", "gemma3": "gemma3"}

_LAYER = re.compile(r"^(?:model\.(?:language_model\.)?|language_model\.model\.)layers\.(\d+)\.(.+)$")
_COMMON = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_NAMES = {
    "qwen2": {**_COMMON, "post_attention_layernorm.weight": "ffn_norm.weight"},
    "gemma3": {**_COMMON, "post_attention_layernorm.weight": "post_attention_norm.weight",
               "pre_feedforward_layernorm.weight": "ffn_norm.weight",
               "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
               "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"},
}
_GLOBAL_NAMES = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
_GLOBAL = re.compile(r"^(?:model\.(?:language_model\.)?|language_model\.model\.)(embed_tokens\.weight|norm\.weight)$")
_LM_HEAD = re.compile(r"^(?:language_model\.)?lm_head\.weight$")


def read_config(hf_dir: Path) -> dict:
    """The text-model config (a multimodal Gemma 3 config's text_config, merged over its top level)."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    if cfg.get("model_type") not in HF_MODEL_TYPES:
        raise ValueError(f"HF model_type {cfg.get('model_type')!r} is not supported; speczoo converts "
                         f"{sorted(HF_MODEL_TYPES)}")
    if "text_config" in cfg:
        cfg = {**cfg, **cfg["text_config"]}
    return cfg


def _rope_bases(cfg: dict) -> tuple[float, float]:
    """(global base, local base) from either the rope_theta / rope_local_base_freq keys or rope_parameters."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and "full_attention" in rp:
        full, local = rp["full_attention"], rp.get("sliding_attention", {})
        for part in (full, local):
            if part.get("rope_type", "default") != "default":
                raise ValueError(f"RoPE type {part['rope_type']!r} is not supported; this model would run wrong")
        return float(full.get("rope_theta", 1e6)), float(local.get("rope_theta", 1e4))
    if isinstance(rp, dict):
        if rp.get("rope_type", "default") != "default":
            raise ValueError(f"RoPE type {rp['rope_type']!r} is not supported; this model would run wrong")
        return float(rp.get("rope_theta", cfg.get("rope_theta", 1e4))), float(cfg.get("rope_local_base_freq", 1e4))
    scaling = cfg.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise ValueError(f"RoPE scaling {scaling} is not supported; this model would run wrong")
    return float(cfg.get("rope_theta", 1e4)), float(cfg.get("rope_local_base_freq", 1e4))


def _sliding_pattern(cfg: dict, n_layers: int) -> int:
    """Every Nth layer (1-based) is global; from sliding_window_pattern or the layer_types list."""
    types = cfg.get("layer_types")
    if not types:
        return int(cfg.get("sliding_window_pattern", 6))
    if len(types) != n_layers or "full_attention" not in types:
        raise ValueError("layer_types must list every layer and include a full_attention layer")
    n = types.index("full_attention") + 1
    expect = ["full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(n_layers)]
    if types != expect:
        raise ValueError(f"layer_types {types} is not 'every {n}th layer global'; speczoo cannot run this layout")
    return n


def hf_model_args(hf_dir: Path, tied: bool) -> ModelArgs:
    """ModelArgs from an HF config.json; `tied`: the checkpoint has no separate LM head."""
    cfg = read_config(hf_dir)
    arch = HF_MODEL_TYPES[cfg["model_type"]]
    dim, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or dim // n_heads)
    theta, local_theta = _rope_bases(cfg)
    common = dict(
        arch=arch, vocab_size=int(cfg["vocab_size"]), dim=dim, n_layers=int(cfg["num_hidden_layers"]),
        n_heads=n_heads, n_kv_heads=int(cfg.get("num_key_value_heads", n_heads)), head_dim=head_dim,
        ffn_dim=int(cfg["intermediate_size"]), norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        tie_embeddings=tied, context_length=int(cfg.get("max_position_embeddings", 32768)))
    if arch == "qwen2":
        if cfg.get("use_sliding_window"):
            raise ValueError("Qwen2 with use_sliding_window is not supported")
        return ModelArgs(**common, qkv_bias=True, act="silu")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"Gemma 3 activation {act!r} is not supported (expected gelu_pytorch_tanh)")
    return ModelArgs(
        **common, rope_local_theta=local_theta, sliding_window=int(cfg.get("sliding_window") or 0),
        sliding_pattern=_sliding_pattern(cfg, common["n_layers"]), qk_norm=True, sandwich_norms=True,
        act="gelu_tanh", embed_scale=math.sqrt(dim),
        query_scale=1.0 / math.sqrt(float(cfg.get("query_pre_attn_scalar", head_dim))),
        final_logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0))


def gguf_name(hf_name: str, arch: str) -> str | None:
    """The GGUF name of an HF tensor; None for the LM head (handled by the caller); error when unknown."""
    if _LM_HEAD.match(hf_name):
        return None
    m = _GLOBAL.match(hf_name)
    if m:
        return _GLOBAL_NAMES[m.group(1)]
    m = _LAYER.match(hf_name)
    if m and m.group(2) in _LAYER_NAMES[arch]:
        return f"blk.{m.group(1)}.{_LAYER_NAMES[arch][m.group(2)]}"
    raise ValueError(f"HF tensor {hf_name!r} has no GGUF name for {arch}; speczoo cannot convert this checkpoint")


def _files(hf_dir: Path) -> list[Path]:
    return sorted(Path(hf_dir).glob("*.safetensors"))


def _is_vision(name: str) -> bool:
    return name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                            "model.multi_modal_projector."))


def hf_tensor_names(hf_dir: Path) -> list[str]:
    names = []
    for f in _files(hf_dir):
        with safe_open(str(f), framework="pt") as st:
            names += [k for k in st.keys() if not _is_vision(k)]
    return names


def hf_has_lm_head(hf_dir: Path) -> bool:
    """A separate LM head exists and the config does not tie it to the embedding."""
    tied = bool(read_config(hf_dir).get("tie_word_embeddings", True))
    return not tied and any(_LM_HEAD.match(n) for n in hf_tensor_names(hf_dir))


def iter_hf_tensors(hf_dir: Path) -> Iterator[tuple[str, Tensor]]:
    """(GGUF name, fp32 tensor [out, in]) one at a time, with llama.cpp's value conventions."""
    arch = HF_MODEL_TYPES[read_config(hf_dir)["model_type"]]
    keep_head = hf_has_lm_head(hf_dir)
    for f in _files(hf_dir):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if _is_vision(key):
                    continue
                name = gguf_name(key, arch)
                if name is None and not keep_head:
                    continue
                t = st.get_tensor(key).float()
                if arch == "gemma3" and key.endswith("norm.weight"):
                    t = t + 1.0                       # llama.cpp stores Gemma's (1 + w) norm scale
                yield name or "output.weight", t


def hf_quant_summary(hf_dir: Path) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for f in _files(hf_dir):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                if not _is_vision(k):
                    counts[str(st.get_slice(k).get_dtype())] += 1
    return dict(sorted(counts.items()))


def _token_text(v) -> str | None:
    return v.get("content") if isinstance(v, dict) else v


def hf_tokenizer(hf_dir: Path) -> tuple[Backend, dict, str | None]:
    """(tokenizers backend, speczoo tokenizer_config, chat template or None) of an HF directory."""
    hf_dir = Path(hf_dir)
    backend = Backend.from_file(str(hf_dir / "tokenizer.json"))
    tc_file = hf_dir / "tokenizer_config.json"
    tc = json.loads(tc_file.read_text()) if tc_file.is_file() else {}
    gc_file = hf_dir / "generation_config.json"
    gc = json.loads(gc_file.read_text()) if gc_file.is_file() else {}
    cfg = read_config(hf_dir)

    def tid(text):
        return None if text is None else backend.token_to_id(text)

    bos_id = tid(_token_text(tc.get("bos_token")))
    if bos_id is None:
        bos_id = cfg.get("bos_token_id")
    eos_ids = []
    for v in (tid(_token_text(tc.get("eos_token"))), gc.get("eos_token_id"), cfg.get("eos_token_id")):
        eos_ids += v if isinstance(v, list) else ([] if v is None else [v])
    eos_ids += [i for i in (backend.token_to_id(t) for t in END_OF_TURN_TOKENS) if i is not None]
    eos_ids = list(dict.fromkeys(int(i) for i in eos_ids))
    if not eos_ids:
        raise ValueError(f"{hf_dir} names no eos token (tokenizer_config.json / generation_config.json)")
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
    if "ByteLevel" in kinds:
        decoding = "byte_level"
    elif "ByteFallback" in kinds:
        decoding = "byte_fallback"
    else:
        raise ValueError(f"{hf_dir}/tokenizer.json has decoder {sorted(k for k in kinds if k)}; speczoo's incremental "
                         "decoder supports ByteLevel and ByteFallback tokenizers")
    post = json.dumps(json.loads(backend.to_str()).get("post_processor"))
    add_bos = bool(tc.get("add_bos_token", bos_id is not None and f'"ids": [{bos_id}]' in post))
    vocab = backend.get_vocab(with_added_tokens=True)
    tokens = [""] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    pad_id = tid(_token_text(tc.get("pad_token")))
    config = tokenizer_config(tokens, bos_id, eos_ids, add_bos, decoding, pad_id, tid(_token_text(tc.get("unk_token"))))
    template = tc.get("chat_template")
    if isinstance(template, list):                           # named templates: use "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja = hf_dir / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    return backend, config, template
