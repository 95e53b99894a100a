"""The EAGLE-3 head: a one-layer network that predicts the target's next tokens from its features.

Shape (EAGLE-3, as the speculators format stores it):
  fc          three target features (low, middle, high layer) [.., 3D] -> one fused feature [.., D]
  layers.0    one decoder layer whose attention reads [input_layernorm(embedding of the current token) ;
              hidden_norm(feature)] [.., 2D]; the residual stream is the feature itself; a gated MLP
  norm        RMSNorm, then lm_head over a reduced draft vocabulary [.., Vd]
  d2t / t2d   draft id -> target id offsets (target = draft + d2t[draft]) and the target ids the draft
              vocabulary covers (bool [V]).
The embedding table is the target's (frozen, never saved). The layer's output hidden state stands in
for the target feature of the next position, so the head can run several steps ahead on its own.

Row convention: the row for target position t holds (feature of t, token at t + 1) at position t + 1
and predicts the token at t + 2. `step` runs rows against the head's own one-layer KV cache (a
speczoo KVCache); `training/eagle/ttt.py` runs the same layer batched for training. This module never
touches the target's cache and never decides acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speczoo.kernels.backends import get_backend
from speczoo.models.args import ModelArgs
from speczoo.models.embedding import EncodedEmbedding
from speczoo.decoding.eagle.config import HeadConfig


class Norm(nn.Module):
    """RMSNorm with a trainable weight: x / sqrt(mean(x^2) + eps) * w."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # [..., D]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """NEOX rotary embedding (rotate halves). x: [..., Hx, Dh]; cos/sin broadcast to it ([..., 1, Dh])."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        d, h, hkv, dh = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(2 * d, h * dh, bias=False)
        self.k_proj = nn.Linear(2 * d, hkv * dh, bias=False)
        self.v_proj = nn.Linear(2 * d, hkv * dh, bias=False)
        self.o_proj = nn.Linear(h * dh, d, bias=False)


class Mlp(nn.Module):
    def __init__(self, d: int, f: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # [..., D] -> [..., D]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """The head's decoder layer, split around its attention so that inference (with a KV cache) and
    training (the unrolled training-time test) share every weight and every line but the attention."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        d = cfg.hidden_size
        self.input_layernorm = Norm(d, cfg.norm_eps)
        self.hidden_norm = Norm(d, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = Norm(d, cfg.norm_eps)
        self.mlp = Mlp(d, cfg.ffn_dim)
        self.shape_q = (cfg.n_heads, cfg.head_dim)
        self.shape_kv = (cfg.n_kv_heads, cfg.head_dim)

    def project(self, emb: Tensor, hid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """emb, hid: [..., D] -> q [..., H, Dh], k and v [..., Hkv, Dh] (not yet rotated)."""
        x = torch.cat((self.input_layernorm(emb), self.hidden_norm(hid)), dim=-1)     # [..., 2D]
        a = self.self_attn
        lead = x.shape[:-1]
        return (a.q_proj(x).view(*lead, *self.shape_q), a.k_proj(x).view(*lead, *self.shape_kv),
                a.v_proj(x).view(*lead, *self.shape_kv))

    def finish(self, attn: Tensor, hid: Tensor) -> Tensor:
        """attn: [..., H * Dh] attention output; hid: [..., D] the residual. Returns the layer output [..., D]."""
        h = hid + self.self_attn.o_proj(attn)
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass
class HeadOut:
    hidden: Tensor     # [S, D] the layer output: the stand-in feature for the next step
    logits: Tensor     # [S, Vd] over the draft vocabulary


class EagleHead(nn.Module):
    def __init__(self, cfg: HeadConfig, embed: Tensor | EncodedEmbedding, seed: int = 0):
        super().__init__()
        if tuple(embed.shape) != (cfg.target_vocab, cfg.hidden_size):
            raise ValueError(f"the target's embedding is {tuple(embed.shape)}, the head expects "
                             f"[{cfg.target_vocab}, {cfg.hidden_size}]: this head was trained for another target")
        self.cfg = cfg
        d = cfg.hidden_size
        if isinstance(embed, EncodedEmbedding):
            self.embed = embed          # [V, D] the target's, rows decoded on lookup: CPU only (train on to_dense())
        else:
            self.register_buffer("embed", embed.float(), persistent=False)  # [V, D] the target's, frozen
        self.fc = nn.Linear(3 * d, d, bias=False)
        self.layers = nn.ModuleList([Layer(cfg)])
        self.norm = Norm(d, cfg.norm_eps)
        self.lm_head = nn.Linear(d, cfg.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long))   # [Vd] offsets
        self.register_buffer("t2d", torch.zeros(cfg.target_vocab, dtype=torch.bool))  # [V]
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)              # [Dh/2]
        g = torch.Generator().manual_seed(seed)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02, generator=g)

    # -- vocabulary ---------------------------------------------------------------------------
    def set_vocab(self, draft_to_target: Tensor) -> None:
        """draft_to_target: [Vd] ascending target ids the draft vocabulary covers."""
        ids = draft_to_target.long().to(self.d2t.device)
        if ids.shape != (self.cfg.draft_vocab,):
            raise ValueError(f"the draft vocabulary has {ids.numel()} ids, the head {self.cfg.draft_vocab}")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def draft_to_target(self) -> Tensor:  # [Vd]
        return torch.arange(self.cfg.draft_vocab, device=self.d2t.device) + self.d2t

    def init_from_target(self, lm_head: Tensor, norm: Tensor) -> None:
        """Warm start from the target: fc passes the high feature through, the layer's attention and MLP
        branches start at zero (the layer starts as the identity), and the LM head and final norm are
        the target's (rows of the draft vocabulary). The head's output then starts in the space the
        target's LM head reads; training teaches the layer the one-position step ahead."""
        d = self.cfg.hidden_size
        layer = self.layers[0]
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, 2 * d:].copy_(torch.eye(d))
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            self.lm_head.weight.copy_(lm_head[self.draft_to_target.cpu()].float())
            self.norm.weight.copy_(norm.float())

    # -- pieces shared with training ------------------------------------------------------------
    def fuse(self, features: Tensor) -> Tensor:
        """features: [..., 3D] (low ; mid ; high target layers) -> [..., D]."""
        return self.fc(features)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [..., 1, Dh] for positions [...]."""
        ang = positions.float()[..., None] * self.inv_freq                 # [..., Dh/2]
        ang = torch.cat((ang, ang), dim=-1)[..., None, :]                  # [..., 1, Dh]
        return ang.cos(), ang.sin()

    # -- inference ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, tokens: Tensor, hidden: Tensor, positions: Tensor, cache, mask: Tensor | None = None) -> HeadOut:
        """Run S rows after the cache's L0 rows: tokens [S] (target ids), hidden [S, D] (a fused target
        feature, or the head's own output of the row's parent), positions [S].

        mask: [S, L0 + S] bool, which cache rows each row sees (a draft tree); None: every earlier row
        and itself. Writes K/V at cache rows [L0, L0 + S) and advances cache.length.
        """
        s = tokens.shape[0]
        l0 = cache.length
        cache.check_room(s)
        layer = self.layers[0]
        q, k, v = layer.project(self.embed[tokens], hidden)               # [S, H, Dh], [S, Hkv, Dh] x2
        cos, sin = self.rope(positions)                                    # [S, 1, Dh]
        kc, vc = cache.k[0], cache.v[0]                                    # [Hkv, C, Dh]
        kc[:, l0:l0 + s] = rotate(k, cos, sin).transpose(0, 1)
        vc[:, l0:l0 + s] = v.transpose(0, 1)
        n = l0 + s
        if mask is None:
            mask = torch.ones(s, n, dtype=torch.bool).tril(l0)             # [S, N]
        elif tuple(mask.shape) != (s, n):
            raise ValueError(f"head mask must be [S, L0 + S] = [{s}, {n}], got {tuple(mask.shape)}")
        attn = F.scaled_dot_product_attention(
            rotate(q, cos, sin).transpose(0, 1)[None], kc[None, :, :n], vc[None, :, :n], attn_mask=mask,
            enable_gqa=self.cfg.n_heads != self.cfg.n_kv_heads)            # [1, H, S, Dh]
        out = layer.finish(attn[0].transpose(0, 1).reshape(s, -1), hidden)  # [S, D]
        cache.length = n
        return HeadOut(hidden=out, logits=self.lm_head(self.norm(out)))

    def pack(self, backend: str) -> EagleHead:
        """Inference only: run every linear layer through the kernels' `backend` (e.g. "q8"), packed now.
        A draft step reads every weight once, so on a CPU it is bound by weight bytes: fp32 costs a
        1.5B target's head more than a target step, q8 a quarter of that. Returns self; a packed head
        neither trains nor saves (its state_dict no longer has the speculators names)."""
        impl = get_backend(backend)
        linears = [(name, m) for name, m in self.named_modules() if isinstance(m, nn.Linear)]
        for name, m in linears:
            parent, _, attr = name.rpartition(".")
            owner = self.get_submodule(parent) if parent else self
            setattr(owner, attr, impl.build(impl.pack(m.weight.detach().float()), None))
        self.packed_backend = backend
        return self

    def kv_args(self) -> ModelArgs:
        """ModelArgs describing the head's one layer, for building its KVCache."""
        c = self.cfg
        return ModelArgs(arch="eagle3", vocab_size=c.target_vocab, dim=c.hidden_size, n_layers=1,
                         n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, ffn_dim=c.ffn_dim)

