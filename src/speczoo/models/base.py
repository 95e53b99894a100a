"""Pieces every decoder model shares: RMSNorm, RoPE with explicit positions, attention over the KV cache.

models/decoder.py wires these into the blocks every architecture file configures. Two attention schemes
give the same result up to round-off:
  * batched (`invariant=False`): one SDPA call over all S query rows with a boolean mask; fast, for the
    fp32/bf16 reference backends, which are not batch-invariant anyway;
  * row by row (`invariant=True`): each query row attends with shapes that depend only on the keys it
    sees, never on S, and a tree row gathers exactly the keys a sequential decode of its path would see,
    in the same order. With a batch-invariant linear backend the whole forward is then bit-identical
    for 1, K + 1 or a whole prefill of rows; this is what makes speculative decoding exactly lossless,
    and what lets a long prefill run PREFILL_ROWS rows at a time, in bounded scratch, to the same bits.
Nothing here may branch on the linear backend or touch tensors beyond the cache slots it is given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speczoo.kernels import attention, native
from speczoo.kernels.linear import LinearBackend
from speczoo.models.forward import CHAIN, EVERY_ROW, Attend, Chain, Packed, Readout, Tree

# a batch-invariant chain forward of more rows runs this many at a time (DecoderBase._in_order): llama.cpp's
# default batch, past which a prefill's rows are no faster together and its scratch only grows
PREFILL_ROWS = 512


@dataclass
class ForwardOut:
    logits: Tensor          # [S, V] fp32 (or [R, V] for the R rows a Readout's `logit_rows` asks for)
    hidden: list[Tensor]    # [S, D] residual stream after each layer index asked for, in order; [] if none


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, per row (GGUF gemma weights already include the +1)."""

    def __init__(self, weight: Tensor, eps: float):
        super().__init__()
        self.weight = weight.float()   # [D]
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # x: [..., D]
        # written out: F.rms_norm is a slower composite on CPU in torch 2.13
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Rope:
    """NEOX-style rotary embedding (rotate halves) with a cos/sin table grown on demand.

    Angles are computed in fp32 as transformers and llama.cpp do (position * inv_freq), so our logits
    track the references to round-off. The table is indexed by explicit positions, never by slot.
    Stored as cos [P, Dh] = (c, c) and a signed sin [P, Dh] = (-s, s), so that rotating is
    x * cos + swap_halves(x) * sin: the same products and sums as transformers' rotate_half form.

    Scalings, as llama.cpp applies them: `factors` [Dh/2] divide each frequency (Llama 3.1's rope_freqs,
    Phi-3's LongRoPE factors), `scale` divides all of them (linear scaling: position p turns as p / scale
    would), `mscale` multiplies cos and sin (LongRoPE's attention factor). `limit` > 0: positions from
    `limit` on are refused (the scaling is only valid below it).
    """

    def __init__(self, head_dim: int, theta: float, initial: int = 4096, factors: Tensor | None = None,
                 scale: float = 1.0, mscale: float = 1.0, limit: int = 0):
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if factors is not None:
            if factors.shape != inv_freq.shape:
                raise ValueError(f"RoPE frequency factors must be [{head_dim // 2}] (head_dim / 2), got "
                                 f"{tuple(factors.shape)}; the model file is inconsistent")
            inv_freq = inv_freq / factors.float()
        if scale != 1.0:
            inv_freq = inv_freq / scale
        self.inv_freq = inv_freq                       # [Dh/2] fp32
        self.mscale = mscale
        self.limit = limit
        self.cos = torch.empty(0, head_dim)
        self.sin = torch.empty(0, head_dim)
        self._grow(min(initial, limit) if limit > 0 else initial)

    def _grow(self, n: int) -> None:
        pos = torch.arange(n, dtype=torch.float32)
        ang = pos[:, None] * self.inv_freq[None, :]    # [P, Dh/2] fp32
        c, s = ang.cos(), ang.sin()
        if self.mscale != 1.0:
            c, s = c * self.mscale, s * self.mscale
        self.cos = torch.cat((c, c), dim=-1)           # [P, Dh]
        self.sin = torch.cat((-s, s), dim=-1)          # [P, Dh]

    def lookup(self, positions: Tensor, max_pos: int) -> tuple[Tensor, Tensor]:
        """cos, sin [S, 1, Dh] for positions [S]; max_pos is the largest position (a Python int)."""
        if self.limit > 0 and max_pos >= self.limit:
            raise ValueError(f"position {max_pos} is past this model's RoPE, which speczoo runs for positions below "
                             f"{self.limit} (LongRoPE's short factors; its long-context factors are not supported "
                             "yet): keep prompt and answer within that context")
        if max_pos >= self.cos.shape[0]:
            n = max(2 * self.cos.shape[0], max_pos + 1)
            self._grow(min(n, self.limit) if self.limit > 0 else n)
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


@dataclass
class Rotation:
    """One forward's RoPE factors: for keys (cos, sin) and for queries, with the query scale folded in."""
    cos: Tensor     # [S, 1, Dh]
    sin: Tensor
    q_cos: Tensor   # cos * query scale
    q_sin: Tensor

    @classmethod
    def at(cls, rope: Rope, positions: Tensor, max_pos: int, q_scale: float) -> Rotation:
        cos, sin = rope.lookup(positions, max_pos)
        return cls(cos, sin, cos * q_scale, sin * q_scale)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [S, H, Dh]; cos/sin: [S, 1, Dh] from Rope.lookup. Returns x rotated, [S, H, Dh]."""
    s, h, d = x.shape
    swapped = x.view(s, h, 2, d // 2).flip(2).view(s, h, d)     # (x2, x1)
    return torch.addcmul(x * cos, swapped, sin)


@dataclass
class AttnPlan:
    """Which cache slots each query row of one forward sees (built once per forward, shared by layers).

    invariant: rows[i] is (lo, hi) for a contiguous slot range or a LongTensor of slots (tree rows);
               keys holds the same rows as the compiled attention kernel takes them.
    batched:   mask [S, N] bool over slots [0, N), N = L0 + S.
    """
    n_keys: int
    rows: list[tuple[int, int] | Tensor] | None = None
    mask: Tensor | None = None
    keys: attention.Plan | None = None


def plan_attention(l0: int, positions: list[int], pos_t: Tensor, tree_mask: Tensor | None, window: int,
                   invariant: bool) -> AttnPlan:
    """Visibility of slots for each new row: prefix slots [0, l0) (slot == position), new slot j when
    j <= i (chain) or tree_mask[i, j], and, for a sliding window W > 0, only keys with pos_i - p < W."""
    s = len(positions)
    n = l0 + s
    if invariant:
        rows: list[tuple[int, int] | Tensor] = []
        for i, p in enumerate(positions):
            lo = max(0, p - window + 1) if window > 0 else 0
            if tree_mask is None:
                rows.append((min(lo, l0 + i), l0 + i + 1))
                continue
            new = tree_mask[i]                                     # [S] bool
            if window > 0:
                new = new & (p - pos_t < window)
            idx = torch.cat((torch.arange(min(lo, l0), l0), l0 + new.nonzero().flatten()))
            rows.append(idx)
        return AttnPlan(n_keys=n, rows=rows, keys=attention.Plan(attention.KeyRows.from_rows(rows)))
    if s == 1:   # one row: the row-by-row scheme is the cheapest and needs no mask
        return plan_attention(l0, positions, pos_t, tree_mask, window, invariant=True)
    key_pos = torch.cat((torch.arange(l0), pos_t))                 # [N] position of every visible slot
    if tree_mask is None:
        new = torch.ones(s, s, dtype=torch.bool).tril()
    else:
        new = tree_mask
    mask = torch.cat((torch.ones(s, l0, dtype=torch.bool), new), dim=1)  # [S, N]
    if window > 0:
        mask = mask & ((pos_t[:, None] - key_pos[None, :]) < window)
    return AttnPlan(n_keys=n, mask=mask)


def plan_keys(keys: attention.KeyRows, invariant: bool) -> AttnPlan:
    """An explicit plan: row i sees exactly the slots keys.slots(i), in that order (several independent
    sequences in one cache, each row seeing its own sequence only; see speczoo/slots.py)."""
    n = int(keys.hi.max())
    if keys.idx.numel():
        n = max(n, int(keys.idx.max()) + 1)
    if invariant:
        return AttnPlan(n_keys=n, keys=attention.Plan(keys))
    mask = torch.zeros(keys.n_rows, n, dtype=torch.bool)
    for i in range(keys.n_rows):
        mask[i, keys.slots(i)] = True
    return AttnPlan(n_keys=n, mask=mask)


def write_kv(k_cache: Tensor, v_cache: Tensor, at: int | Tensor, k: Tensor, v: Tensor) -> None:
    """Store this forward's rotated keys and values k, v [S, Hkv, Dh] in a layer's cache [Hkv, C, Dh]: at
    slots [at, at + S) for an int, or at the slots at[i] (int64 [S]) for rows of several sequences. A 16-bit
    cache gets each value rounded once, as a slice copy rounds it (index_put does not convert by itself)."""
    if isinstance(at, Tensor):
        k_cache[:, at] = k.transpose(0, 1).to(k_cache.dtype)
        v_cache[:, at] = v.transpose(0, 1).to(v_cache.dtype)
    else:
        k_cache[:, at:at + k.shape[0]] = k.transpose(0, 1)
        v_cache[:, at:at + v.shape[0]] = v.transpose(0, 1)


def attend(q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: AttnPlan, softcap: float = 0.0) -> Tensor:
    """q: [S, H, Dh] (already scaled and rotated); k_cache/v_cache: [Hkv, C, Dh] with this forward's keys
    written. softcap > 0: scores become softcap * tanh(scores / softcap) before the softmax (gemma2).
    Returns [S, H * Dh] fp32."""
    s, h, dh = q.shape
    hkv = k_cache.shape[0]
    if plan.mask is not None:
        n = plan.n_keys
        k = k_cache[:, :n]
        v = v_cache[:, :n]
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        qh = q.transpose(0, 1)                                      # [H, S, Dh]
        if softcap > 0:                                             # SDPA cannot cap: written out
            k, v = k.repeat_interleave(h // hkv, 0), v.repeat_interleave(h // hkv, 0)   # [H, N, Dh]
            scores = torch.tanh(torch.matmul(qh, k.transpose(1, 2)) / softcap) * softcap   # [H, S, N]
            scores = scores.masked_fill(~plan.mask, float("-inf"))
            return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(0, 1).reshape(s, h * dh)
        out = F.scaled_dot_product_attention(
            qh[None], k[None], v[None], attn_mask=plan.mask, scale=1.0,
            enable_gqa=hkv != h)                                   # [1, H, S, Dh]
        return out[0].transpose(0, 1).reshape(s, h * dh)
    # row by row in the compiled kernel (kernels/attention.py; its torch twin for a non-fp32 cache)
    keys = plan.keys if plan.keys is not None else attention.KeyRows.from_rows(plan.rows)
    return attention.attend(q, k_cache, v_cache, keys, softcap=softcap).view(s, h * dh)


def make_linear(name: str, tensors: Mapping[str, Tensor], backend: LinearBackend,
                packed: Mapping[str, Tensor] | None, bias: str | None = None,
                source: str | None = None) -> nn.Module:
    """Build one linear layer through the backend: from its stored packing "<name>.<part>" when the
    bundle has one, else by packing the fp32 weight `source` (default: `name`) now."""
    b = tensors[bias].float() if bias is not None else None
    if packed is not None:
        prefix = name + "."
        parts = {k[len(prefix):]: t for k, t in packed.items() if k.startswith(prefix)}
        if not parts:
            raise KeyError(f"packed weights have no entries for {name!r} (expected keys '{name}.<part>'); "
                           "the bundle's packed file is incomplete: re-pull the model")
        return backend.build(parts, b)
    w = tensors[source or name].to_dense()      # the tensor itself; a tied head: every row of an EncodedEmbedding
    return backend.build(backend.pack(w), b)


class Mlp(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); `gate_up` returns (gate(x), up(x)) (FusedLinears: one kernel call
    when the backend fuses; or one fused GGUF tensor split in two)."""

    def __init__(self, gate_up: nn.Module, down: nn.Module, act: str):
        super().__init__()
        self.gate_up, self.down = gate_up, down
        if act == "silu":
            self.act = F.silu
        elif act == "gelu_tanh":
            self.act = lambda x: F.gelu(x, approximate="tanh")
        else:
            raise ValueError(f"unknown activation {act!r}; expected 'silu' or 'gelu_tanh'")

    def forward(self, x: Tensor) -> Tensor:  # x: [S, D] -> [S, D]
        gate, up = self.gate_up(x)                                 # [S, F] each
        return self.down(self.act(gate) * up)


class DecoderBase(nn.Module):
    """Shared forward scaffolding: input checks, hidden-layer bookkeeping, the LM head.

    Subclasses set self.args, self.embed [V, D] fp32 (a Tensor, or an EncodedEmbedding that decodes the
    rows looked up), self.layers, self.norm, self.lm_head, self.invariant, and implement `_run_layers`.
    `one_row_prefetch`: whether the compiled kernels' one-row tiles prefetch this model's weights in software,
    set on the kernels before each forward (the model's cost profile times both on the machine at hand:
    decoding/pricing/one_row.py); it changes the time only, never a bit of a result.
    """

    def __init__(self):
        super().__init__()
        self.one_row_prefetch = False

    def _check(self, tokens: Tensor, positions: Tensor, cache, attend: Attend) -> None:
        if tokens.dim() != 1 or positions.shape != tokens.shape:
            raise ValueError(f"tokens and positions must both be [S]; got {tuple(tokens.shape)} and "
                             f"{tuple(positions.shape)}")
        s = tokens.shape[0]
        if s == 0:
            raise ValueError("forward needs at least one token")
        if isinstance(attend, Tree) and attend.mask.shape[0] != s:
            raise ValueError(f"the Tree's mask is [{attend.mask.shape[0]}, {attend.mask.shape[0]}] for {s} tokens")
        if isinstance(attend, Packed) and attend.keys.n_rows != s:
            raise ValueError(f"the Packed keys have {attend.keys.n_rows} rows for {s} tokens")
        if cache.args.n_layers != self.args.n_layers or cache.args.head_dim != self.args.head_dim \
                or cache.args.n_kv_heads != self.args.n_kv_heads or cache.args.conv_layers != self.args.conv_layers:
            raise ValueError("this KV cache was built for a different model; make one with KVCache(model.args, ...)")
        if not isinstance(attend, Packed):
            cache.check_room(s)
        elif int(attend.dest.max()) >= cache.capacity:
            raise ValueError(f"Packed dest slots must lie in [0, {cache.capacity}) of the cache")

    def _hidden_slots(self, hidden_layers: Sequence[int]) -> dict[int, list[int]]:
        slots: dict[int, list[int]] = {}
        n = self.args.n_layers
        for k, layer in enumerate(hidden_layers):
            li = layer + n if layer < 0 else layer
            if not 0 <= li < n:
                raise ValueError(f"hidden layer {layer} out of range for a {n}-layer model")
            slots.setdefault(li, []).append(k)
        return slots

    def forward(self, tokens: Tensor, positions: Tensor, cache, *, attend: Attend = CHAIN,
                readout: Readout = EVERY_ROW) -> ForwardOut:
        """tokens, positions: [S] int64. Writes the rows' K/V into the cache and returns their logits.

        attend: how the new rows attend and where their K/V go (models/forward.py): Chain() (the default)
        or Tree(mask) write at slots [L0, L0+S) and advance cache.length by S; Packed(keys, dest) writes
        at dest and leaves cache.length alone.
        readout: which rows' logits [R, V], through which head, and which layers' hidden states [S, D].
        """
        self._check(tokens, positions, cache, attend)
        native.set_one_row_prefetch(self.one_row_prefetch)
        slots = self._hidden_slots(readout.hidden_layers)
        if isinstance(attend, Packed):
            hidden: list[Tensor | None] = [None] * len(readout.hidden_layers)
            x = self._run_layers(tokens, positions, cache, attend.dest, attend, slots, hidden)   # [S, D]
        else:
            x, hidden = self._in_order(tokens, positions, cache, attend, slots, len(readout.hidden_layers))
        if readout.logit_rows is not None:
            x = x[readout.logit_rows]
        logits = (readout.head if readout.head is not None else self.lm_head)(self.norm(x))   # [R, V]
        cap = self.args.final_logit_softcap
        if cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return ForwardOut(logits=logits, hidden=hidden)  # type: ignore[arg-type]

    def _in_order(self, tokens: Tensor, positions: Tensor, cache, attend: Attend, slots: dict[int, list[int]],
                  n_hidden: int) -> tuple[Tensor, list[Tensor | None]]:
        """Chain or Tree rows written at slots [L0, L0 + S), cache.length advanced by S: the residual stream
        after the last block [S, D] and the `n_hidden` hidden states asked for ([S, D] each).

        A chain of more than PREFILL_ROWS rows (a long prompt's prefill) on a batch-invariant model runs
        PREFILL_ROWS rows at a time: each row attends row by row to the slots before it, all written by then,
        and the linears compute each row alone, so every K/V, hidden state and logit is the one a single
        forward gives, bit for bit, while the scratch the kernels keep (a few hundred KB a row for an 8B, kept
        at its largest) stays that of PREFILL_ROWS rows, as llama.cpp's compute buffer is sized by its batch."""
        s, l0 = tokens.shape[0], cache.length
        step = PREFILL_ROWS if isinstance(attend, Chain) and self.invariant else s
        xs: list[Tensor] = []
        hiddens: list[list[Tensor | None]] = []
        try:
            for a in range(0, s, step):
                hidden: list[Tensor | None] = [None] * n_hidden
                xs.append(self._run_layers(tokens[a:a + step], positions[a:a + step], cache, l0 + a, attend, slots,
                                           hidden))                                                # [step, D]
                hiddens.append(hidden)
                cache.length = l0 + min(s, a + step)
        except BaseException:
            cache.length = l0
            raise
        if len(xs) == 1:
            return xs[0], hiddens[0]
        return torch.cat(xs), [torch.cat([h[k] for h in hiddens]) for k in range(n_hidden)]   # type: ignore[misc]

    def _run_layers(self, tokens, positions, cache, at, attend: Attend, slots, hidden) -> Tensor:
        """The blocks over the embedded tokens; at: l0, or the rows' cache slots [S] (Packed's dest)."""
        raise NotImplementedError


def default_query_scale(args) -> float:
    return args.query_scale if args.query_scale > 0 else 1.0 / math.sqrt(args.head_dim)
