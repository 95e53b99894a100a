"""Save and load an EAGLE-3 head in the speculators format (what vLLM and SGLang load).

A head directory holds config.json (see `decoding/eagle/config.py`) and model.safetensors with the
speculators tensor names: fc.weight, layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}
.weight, layers.0.self_attn.{q,k,v,o}_proj.weight, layers.0.mlp.{gate,up,down}_proj.weight,
norm.weight, lm_head.weight, d2t (int64 [Vd]) and t2d (bool [V]), the last two left out when the draft
vocabulary is the target's whole vocabulary (as vLLM expects). The embedding table is not
stored: the head reads its target's (a head from elsewhere that carries its own embed_tokens.weight
runs on that one instead). Writes are atomic (a temporary directory moved into place);
nothing is ever pickled.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file
import torch
from torch import Tensor

from speczoo.decoding.eagle.config import HeadConfig
from speczoo.decoding.eagle.head import EagleHead
from speczoo.paths import replace_dir

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def head_state(head: EagleHead) -> dict[str, Tensor]:
    """The head's tensors under their speculators names, on the CPU, contiguous. A head whose draft
    vocabulary is the target's whole vocabulary stores no d2t / t2d: the map is the identity, and vLLM's
    Eagle3LlamaForCausalLM then has no draft_id_to_target_id to load it into (it refuses the file:
    "There is no module or parameter named 'draft_id_to_target_id'")."""
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    if head.cfg.draft_vocab == head.cfg.target_vocab:
        del state["d2t"], state["t2d"]
    return state


def save_head(head: EagleHead, out_dir: Path, metadata: dict[str, str] | None = None) -> Path:
    """Write the head to out_dir (replaced atomically). Returns out_dir."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        head.cfg.write(tmp / CONFIG_FILE)
        save_file(head_state(head), str(tmp / WEIGHTS_FILE), metadata={"format": "pt", **(metadata or {})})
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def read_config(head_dir: Path) -> HeadConfig:
    f = Path(head_dir) / CONFIG_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{f} is missing: {head_dir} is not an EAGLE-3 head directory")
    return HeadConfig.read(f)


def load_head(head_dir: Path, embed: Tensor) -> EagleHead:
    """Build the head saved in head_dir on the target embedding `embed` [V, D]."""
    head_dir = Path(head_dir)
    cfg = read_config(head_dir)
    weights = head_dir / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} is missing: the head in {head_dir} is incomplete")
    state = load_file(str(weights))
    own = state.pop("embed_tokens.weight", None)
    head = EagleHead(cfg, embed if own is None else own)
    if cfg.draft_vocab == cfg.target_vocab and "d2t" not in state:     # the whole vocabulary: the identity
        state["d2t"] = torch.zeros(cfg.draft_vocab, dtype=torch.long)
        state["t2d"] = torch.ones(cfg.target_vocab, dtype=torch.bool)
    if "t2d" not in state and "d2t" in state:      # some exporters leave the derivable mask out
        t2d = head.t2d.clone()
        t2d[state["d2t"] + torch.arange(cfg.draft_vocab)] = True
        state["t2d"] = t2d
    expected = set(head.state_dict())
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ValueError(f"{weights} does not match an EAGLE-3 head: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")
    head.load_state_dict(state)
    head.eval()
    return head
