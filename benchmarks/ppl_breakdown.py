"""Where a quantized path loses precision: perplexity, top-1 and KL against the fp32 reference, one cause at a time.

    python -m benchmarks.ppl_breakdown MODEL --text FILE [--ctx 512] [--chunks 2] [--variants a,b,...]

MODEL is a pulled zoo name. Every variant is the fp32 model of the GGUF (its tensors dequantized) with
one change simulated in PyTorch, so each cause is measured alone:
  - weights: a GGUF type's tensors replaced by their round trip through a kernel format ("q4": the
    bundle's stored q4 packing where it has one, else pack_q4 now; "q8row": pack_q8, one scale per row);
  - activations: every linear's input quantized to int8 and back, one scale (amax / 127, round half to
    even) per row ("row"), or per block of 256 or 32 inputs ("b256", "b32"), before an fp32 F.linear.
A "kernel:" variant runs the real compiled kernels instead: "kernel:q4" / "kernel:q8" the bundle's stored
packing, "kernel:policy" each GGUF type in the kernel format that holds it (Q4_K -> q4, Q6_K -> q6,
Q8_0 / Q5_0 / Q4_0 -> q8b, from their blocks, exactly; anything else -> q8b quantized from fp32),
"kernel:q8b-all" every linear in q8b (Q4_K quantized at 8 bits from fp32). Protocol and metrics: speczoo.bench.ppl (llama-perplexity's
chunks). This module is a measurement script: the runtime never imports it.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from speczoo.bench.ppl import Chunks, PplScore, evaluate, make_chunks, model_logits
from speczoo.kernels import native
from speczoo.kernels.backends import register
from speczoo.kernels.linear import LinearBackend
from speczoo.kernels.pack import pack_q4, pack_q8, unpack_q4, unpack_q8
from speczoo.kernels.pack_q6 import pack_q6_gguf
from speczoo.kernels.pack_q8b import Q8B_GGUF_TYPES, pack_q8b, pack_q8b_gguf
from speczoo.kernels.quantized import build_compiled
from speczoo.models.loader import build_model, packed_weights_file
from speczoo.tokenizer import Tokenizer
from speczoo.zoo.bundle import find_bundle, source_gguf
from speczoo.zoo.gguf import gguf_model_args, iter_gguf_blocks, iter_gguf_tensors, open_gguf


@dataclass(frozen=True)
class Variant:
    name: str
    weights: dict[str, str] = field(default_factory=dict)   # GGUF type -> "q4" | "q8row" (others exact)
    act: str = "fp32"                                         # fp32 | row | b256 | b32
    kernel: str | None = None                                 # a real backend from the bundle instead


ALL_TYPES = ("Q4_K", "Q5_0", "Q6_K", "Q8_0", "Q5_K", "Q4_0", "Q4_1", "Q5_1", "F16", "BF16", "F32")
EVERY = {t: "q4" for t in ALL_TYPES}
NOT_Q4K = [t for t in ALL_TYPES if t != "Q4_K"]
VARIANTS = {v.name: v for v in (
    Variant("fp32"),
    Variant("act-row", act="row"),
    Variant("act-b256", act="b256"),
    Variant("act-b32", act="b32"),
    Variant("w-q4-all", weights=EVERY),
    Variant("w-q4-Q6_K", weights={"Q6_K": "q4"}),
    Variant("w-q4-Q5_0", weights={"Q5_0": "q4"}),
    Variant("w-q4-Q8_0", weights={"Q8_0": "q4"}),
    Variant("w-q8row-notQ4K", weights={t: "q8row" for t in NOT_Q4K}),
    Variant("today-q4", weights=EVERY, act="row"),
    Variant("today-q4mix", weights={t: "q8row" for t in NOT_Q4K}, act="row"),
    Variant("q4-all+b256", weights=EVERY, act="b256"),
    Variant("kernel:q4", kernel="q4"),
    Variant("kernel:q8", kernel="q8"),
    Variant("kernel:policy", kernel="policy"),
    Variant("kernel:q8b-all", kernel="q8b-all"),
)}


def fake_quant(x: Tensor, act: str) -> Tensor:
    """x [S, K] through int8 and back: one scale per row or per block of 256 / 32 inputs."""
    if act == "fp32":
        return x
    s, k = x.shape
    b = k if act == "row" else int(act[1:])
    kp = -(-k // b) * b
    xp = F.pad(x, (0, kp - k)).view(s, kp // b, b)                 # [S, KB, B]
    sa = xp.abs().amax(-1, keepdim=True) / 127.0                    # [S, KB, 1]
    safe = torch.where(sa > 0, sa, torch.ones_like(sa))
    q = torch.round(xp / safe).clamp_(-127, 127)
    return (q * sa).view(s, kp)[:, :k]


class SimLinear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None, act: str):
        super().__init__()
        self.weight, self.bias, self.act = weight, bias, act

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] -> [S, N]
        return F.linear(fake_quant(x.reshape(-1, x.shape[-1]), self.act), self.weight, self.bias).view(
            *x.shape[:-1], self.weight.shape[0])


class SimBackend(LinearBackend):
    """fp32 linears whose weights come from `weights` (by the fp32 tensor's identity) and whose inputs are
    fake-quantized by `act`."""

    name = "sim"

    def __init__(self, replace: dict[int, Tensor], act: str):
        self.replace, self.act = replace, act

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return {"weight": self.replace.get(weight.data_ptr(), weight)}

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return SimLinear(packed["weight"], bias, self.act)


class PolicyBackend(LinearBackend):
    """The real kernels, a format per GGUF type (see the module doc); `everything` puts every linear in q8b."""

    name = "policy"

    def __init__(self, weights: Weights, everything: bool):
        self.w, self.everything = weights, everything
        self.names = {weights.tensors[n].data_ptr(): n for n in weights.linear_names()}

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        name = self.names[weight.data_ptr()]
        kind = self.w.types[name]
        if kind == "Q4_K" and not self.everything:
            return self.w.stored_q4(name) or pack_q4(weight)
        if kind == "Q6_K" and not self.everything:
            return pack_q6_gguf(self.w.raw[name], kind, weight.shape[1])
        if kind in Q8B_GGUF_TYPES:
            return pack_q8b_gguf(self.w.raw[name], kind, weight.shape[1])
        return pack_q8b(weight)

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return build_compiled(packed, bias, native.kernels())


class Weights:
    """The GGUF's fp32 tensors, their types, the raw blocks of the linear weights, and the round trips of
    the linear weights (made once each)."""

    def __init__(self, gguf: Path, bundle: Path):
        reader = open_gguf(gguf)
        self.args = gguf_model_args(reader)
        self.types = {t.name: t.tensor_type.name for t in reader.tensors}
        self.tensors = dict(iter_gguf_tensors(reader))
        self.raw = {n: data for n, _, data in iter_gguf_blocks(reader, set(self.linear_names()))}
        self.bundle = bundle
        self._trips: dict[tuple[str, str], Tensor] = {}

    def linear_names(self) -> list[str]:
        from speczoo.models.loader import linear_weight_sources
        return sorted(set(linear_weight_sources(self.tensors).values()))

    def stored_q4(self, name: str) -> dict[str, Tensor] | None:
        f = self.bundle / packed_weights_file("q4")
        if not f.is_file():
            return None
        key = "output.weight" if name == "token_embd.weight" else name
        with safe_open(str(f), framework="pt") as st:
            parts = {k[len(key) + 1:]: st.get_tensor(k) for k in st.keys() if k.startswith(key + ".")}
        return parts or None

    def trip(self, name: str, how: str) -> Tensor:
        if (name, how) not in self._trips:
            w = self.tensors[name]
            if how == "q4":
                packed = self.stored_q4(name) or pack_q4(w)
                out = unpack_q4(packed).dequantize()[:, : w.shape[1]].contiguous()
            else:
                q, s = unpack_q8(pack_q8(w))
                out = q.float() * s[:, None]
            self._trips[(name, how)] = out
        return self._trips[(name, how)]

    def model(self, v: Variant) -> nn.Module:
        replace = {}
        for name in self.linear_names():
            how = v.weights.get(self.types[name])
            if how is not None:
                replace[self.tensors[name].data_ptr()] = self.trip(name, how)
        backend = SimBackend(replace, v.act)
        register(backend)
        return build_model(self.args, self.tensors, "sim")


def run_variant(v: Variant, weights: Weights, chunks: Chunks, ref, model_name: str) -> PplScore:
    if v.kernel in ("q4", "q8"):
        from speczoo.zoo.weights import load_model
        model = load_model(find_bundle(model_name), v.kernel)
    elif v.kernel is not None:
        register(PolicyBackend(weights, everything=v.kernel == "q8b-all"))
        model = build_model(weights.args, weights.tensors, "policy")
    else:
        model = weights.model(v)
    score, _ = evaluate(model_logits(model), chunks, ref)
    del model
    gc.collect()
    return score


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args(argv)
    bundle = find_bundle(a.model)
    tok = Tokenizer.from_bundle(bundle)
    ids = tok.encode(Path(a.text).read_text(), add_special=True)
    chunks = make_chunks(ids, a.ctx, a.chunks, tok.bos_id if tok.add_bos else None)
    weights = Weights(source_gguf(bundle), bundle)
    print(f"{a.model}: {chunks.ids.shape[0]} chunks of {a.ctx}, {chunks.positions} scored positions; tensor "
          f"types {sorted(set(weights.types[n] for n in weights.linear_names()))}", flush=True)
    tmp = tempfile.TemporaryDirectory(prefix="speczoo-ppl-")
    ref_score, ref = evaluate(model_logits(weights.model(VARIANTS["fp32"])), chunks, keep=Path(tmp.name) / "ref.npy")
    print("| variant | weights | activations | ppl | vs fp32 | top-1 vs fp32 | KL |", flush=True)
    print("|---|---|---|---:|---:|---:|---:|", flush=True)
    print(f"| fp32 | exact | fp32 | {ref_score.ppl:.4f} | — | 1.0000 | 0 |", flush=True)
    for name in a.variants.split(","):
        if name == "fp32":
            continue
        v = VARIANTS[name]
        s = run_variant(v, weights, chunks, ref, a.model)
        w = f"backend {v.kernel}" if v.kernel else (", ".join(f"{t}->{h}" for t, h in v.weights.items()
                                                             if t in weights.types.values()) or "exact")
        print(f"| {name} | {w} | {v.act if not v.kernel else 'kernel'} | {s.ppl:.4f} | "
              f"{100 * (s.ppl / ref_score.ppl - 1):+.2f}% | {s.agreement:.4f} | {s.kl:.5f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
