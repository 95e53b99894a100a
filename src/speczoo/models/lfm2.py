"""LFM2 (Liquid AI's LFM2 and LFM2.5 dense models, 350M .. 2.6B): a hybrid of short-convolution layers and
attention layers, each followed by a SiLU gated MLP.

GGUF (llama.cpp's converter): `lfm2.attention.head_count_kv` is a per-layer list whose zeros mark the
convolution layers; `lfm2.shortconv.l_cache` is the convolution's taps L (3). Tensors (blk.N.): attn_norm
(HF's operator_norm) and ffn_norm, ffn_gate, ffn_up, ffn_down on every layer; an attention layer has attn_q,
attn_k, attn_v, attn_q_norm and attn_k_norm ([head_dim] each, per head before RoPE, as Qwen3), attn_output; a
convolution layer has shortconv.in_proj ([3D, D]: B, C, x), shortconv.conv ([D, L], depthwise, no bias) and
shortconv.out_proj (models/shortconv.py). The final norm is token_embd_norm (HF's embedding_norm, applied
after the last layer); the LM head is tied to the embedding. NEOX RoPE. A sliding-window variant, a
convolution bias and the mixture of experts (arch lfm2moe) are refused.

State: K/V for the attention layers only, and the convolution layers' inputs of each sequence's last rows
(models/conv_rows.py) in the same cache, both rolled back by its integer length.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from speczoo.kernels.linear import LinearBackend
from speczoo.models.args import ModelArgs
from speczoo.models.decoder import Decoder, Layout
from speczoo.models.forward import Attend
from speczoo.models.meta import GGUFMeta
from speczoo.models.shortconv import CONV, IN_PROJ, OUT_PROJ, ShortConvBlock, predecessors


class Lfm2(Decoder):
    ARCH = "lfm2"
    LAYOUT = Layout(attn_norm="attn_norm", qkv=("attn_q", "attn_k", "attn_v"), wo="attn_output",
                    ffn_norm="ffn_norm", gate_up=("ffn_gate", "ffn_up"), down="ffn_down",
                    qk_norm=("attn_q_norm", "attn_k_norm"))
    OUTPUT_NORM = "token_embd_norm"

    def __init__(self, args: ModelArgs, tensors: Mapping[str, Tensor], backend: LinearBackend,
                 packed: Mapping[str, Tensor] | None = None):
        super().__init__(args, tensors, backend, packed)
        conv = set(args.conv_layers)
        # each layer's index among its kind: its K/V in the cache, or its rows in the cache's ConvRows
        self.index = [(args.conv_layers if i in conv else args.kv_layers).index(i) for i in range(args.n_layers)]

    def _block(self, args: ModelArgs, i: int, tensors: Mapping[str, Tensor], backend: LinearBackend,
               packed: Mapping[str, Tensor] | None) -> nn.Module:
        if i in args.conv_layers:
            return ShortConvBlock(self.LAYOUT, args, i, tensors, backend, packed)
        return super()._block(args, i, tensors, backend, packed)

    @classmethod
    def linear_weights(cls) -> tuple[str, ...]:
        return (*cls.LAYOUT.linear_weights(), IN_PROJ, OUT_PROJ)

    @classmethod
    def args_from_gguf(cls, meta: GGUFMeta) -> ModelArgs:
        meta.refuse_rope_scaling()
        if int(meta.get("attention.sliding_window", 0) or 0) > 0:
            raise ValueError("this LFM2 file has sliding-window attention, which speczoo does not run for lfm2")
        kv = meta.get("attention.head_count_kv")
        conv = [i for i, n in enumerate(kv) if int(n) == 0] if isinstance(kv, list) else []
        taps = int(meta.require("shortconv.l_cache"))
        if conv and taps < 2:
            raise ValueError(f"lfm2.shortconv.l_cache is {taps}; a short convolution needs at least 2 taps")
        if any(meta.has_tensor(f"blk.{i}.{name}.bias") for i in conv for name in (IN_PROJ, CONV, OUT_PROJ)):
            raise ValueError("this LFM2 file's short convolutions have biases (conv_bias), which llama.cpp and "
                             "speczoo do not run")
        return ModelArgs(**meta.common, qk_norm=True, act="silu", conv_layers=conv, conv_kernel=taps if conv else 0)

    def _run_layers(self, tokens, positions, cache, at, attend: Attend, slots, hidden) -> Tensor:
        rots, plans = self._attention(positions, at, attend)
        rot, plan = rots[False], plans[False]
        rows = cache.conv                                   # None only for an LFM2 without convolution layers
        conv_plan = None if rows is None else rows.plan(*predecessors(attend, at, tokens.shape[0], rows.width))
        x = self._embed(tokens)
        for li, layer in enumerate(self.layers):
            j = self.index[li]
            if isinstance(layer, ShortConvBlock):
                x = layer(x, rows, j, conv_plan)
            else:
                x = layer(x, rot, cache.k[j], cache.v[j], at, plan)
            for k in slots.get(li, ()):
                hidden[k] = x
        return x
