"""Every GGUF type a user may hold pulls and runs: a tiny qwen2 whose every 2-D tensor (the linear weights
and the tied embedding) is of one type, written with gguf's quantizer where it has one and with random
blocks of the type where it has none (tests/tiny_gguf.py `typed_blocks`).

Where llama.cpp's llama-quantize is found ($SPECZOO_LLAMA_QUANTIZE or on PATH), the types gguf cannot
quantize are also made by it, from an F32 file, and held to the same bounds (IQ1_*, IQ2_* and IQ3_XXS
need an importance matrix there: the random blocks cover them).

For each type: the pull puts each weight in the kernel format zoo/policy.py's table gives it and says so
in the manifest; the fp32 reference is gguf's own values, bit for bit; and the logits of the default
("mixed") backend equal those of a reference that quantizes activations as the kernels do but keeps the
source's exact fp32 weights ("fp32-act8-B", B the format's activation block; plain "fp32" for the float
formats, which quantize no activation), within the bound of the weight's format: fp32 rounding where the
format holds the type exactly (Q4_K -> q4, Q6_K -> q6, Q4_0 -> q40, Q5_0 -> q50, Q8_0 -> q80, Q3_K -> q8b,
Q4_1 / Q5_1 / Q5_K -> q8bm, F32 / F16 / BF16 -> f32 / f16 / bf16); where it does not (q8b from fp32: the IQ, ternary and
FP4 types, Q2_K), the logits are bit for bit those of that format packed from the exact fp32 values (no
other loss on the way), within Q8_LOGIT_BOUND of the reference, and the measured weight error is under q8's
ceiling. So a format that silently lost precision, or a
transcode one code off, fails here. A Q4_0, Q5_0 or Q8_0 file decodes in its own bits (q40, q50, q80) bit for
bit as it did in q8b (the earlier table's row, 10 bits a weight).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from tiny_gguf import write_tiny_gguf
from torch import Tensor, nn

from speczoo.cache import KVCache
from speczoo.kernels import backends, linear
from speczoo.kernels.quantized import ACT_BLOCK, quantize_blocks
from speczoo.models.args import ModelArgs
from speczoo.models.loader import build_model
from speczoo.zoo.bundle import read_manifest
from speczoo.zoo.policy import POLICY, PackRow, Rule
from speczoo.zoo.pull import pull
from speczoo.zoo.weights import load_model, reference_tensors

DIMS = dict(dim=256, n_heads=4, head_dim=64, n_kv_heads=2, ffn_dim=512, n_layers=1)
EXACT_BOUND = 1e-4          # relative rms of the logits: fp32 rounding of the same products in another order
Q8_ERROR_CEILING = 0.03     # q8's per-row int8 on these 256- and 512-wide rows: about 1%, never 3%
Q8_LOGIT_BOUND = 0.08       # q8 weights and int8 activations through a layer and the head: 1-5% measured


class Act8Linear(nn.Module):
    """The kernels' activation quantization (int8, one scale per `block` inputs of a row) on exact fp32
    weights."""

    def __init__(self, weight: Tensor, bias: Tensor | None, block: int):
        super().__init__()
        self.weight, self.bias, self.block = weight, bias, block

    def forward(self, x: Tensor) -> Tensor:  # x: [S, K] -> [S, N]
        x2 = x.reshape(-1, x.shape[-1])
        xq, sa = quantize_blocks(x2, self.block)                          # [S, K] int8, [S, KB]
        y = torch.zeros(x2.shape[0], self.weight.shape[0])
        for b in range(sa.shape[1]):
            k0, k1 = b * self.block, min(x2.shape[1], (b + 1) * self.block)
            y = y + F.linear(xq[:, k0:k1].float(), self.weight[:, k0:k1]) * sa[:, b:b + 1]
        y = y if self.bias is None else y + self.bias
        return y.view(*x.shape[:-1], -1)


class Act8Backend(linear.LinearBackend):
    """fp32-act8-B: exact fp32 weights, activations quantized per block of B as a format's kernel does."""

    batch_invariant = True

    def __init__(self, block: int):
        self.block, self.name = block, f"fp32-act8-{block}"

    def pack(self, weight: Tensor) -> dict[str, Tensor]:
        return {"weight": weight.float()}

    def build(self, packed: dict[str, Tensor], bias: Tensor | None) -> nn.Module:
        return Act8Linear(packed["weight"], bias, self.block)


for _block in set(ACT_BLOCK.values()):
    if f"fp32-act8-{_block}" not in backends.BACKENDS:
        backends.register(Act8Backend(_block))


def _quiet(msg: str) -> None:
    pass


def _logits(model, n: int = 12) -> Tensor:
    tokens = (torch.arange(n) * 37 + 5) % model.args.vocab_size
    return model(tokens, torch.arange(n), KVCache(model.args, max_seq=32)).logits     # [S, V]


def _rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _check_pulled(path, kind: str, want: dict[str, Tensor] | None = None) -> None:
    """Pull `path`, whose 2-D tensors are all of GGUF type `kind`, and hold it to the policy's bounds."""
    bundle = pull(str(path), progress=False, log=_quiet).bundle
    m = read_manifest(bundle)
    rule = POLICY[kind]
    rows = [PackRow.from_json(r) for r in m.packing["mixed"]]
    assert [(r.source_type, r.format, r.exact) for r in rows] == [(kind, rule.format, rule.exact)]
    assert rows[0].tensors == 7 * DIMS["n_layers"] + 1          # 7 linears a layer + the tied head

    ref = reference_tensors(bundle)                              # gguf's values, bit for bit
    assert want is None or all(torch.equal(ref[k].view(torch.int32), want[k].view(torch.int32)) for k in want)

    block = ACT_BLOCK.get(rule.format)                           # None: a float format, x not quantized
    exact_weights = _logits(load_model(bundle, "fp32" if block is None else f"fp32-act8-{block}"))
    fast = _logits(load_model(bundle, "mixed"))
    err = _rel(fast, exact_weights)
    if rule.exact:
        assert rows[0].err2 == 0.0 and err < EXACT_BOUND, (kind, err)
    else:
        assert rule.format in ("q6", "q8b")
        assert 0.0 < rows[0].relative_error < Q8_ERROR_CEILING, (kind, rows[0].relative_error)
        assert torch.equal(fast, _logits(build_model(ModelArgs.from_json(bundle / "config.json"), ref, rule.format)))
        assert err < Q8_LOGIT_BOUND, (kind, err)


@pytest.mark.parametrize("kind", sorted(POLICY))
def test_every_type_pulls_into_its_format_and_runs_within_its_bound(tmp_path, home, kind):
    path, want = write_tiny_gguf(tmp_path / f"{kind}.gguf", "qwen2", seed=3, linear_type=kind, **DIMS)
    _check_pulled(path, kind, want)


def _greedy(model, steps: int = 8) -> tuple[list[int], Tensor]:
    """A 6-token prefill, then `steps` greedy decode steps: the tokens and every step's logits [steps + 1, V]."""
    cache = KVCache(model.args, max_seq=32)
    toks = (torch.arange(6) * 37 + 5) % model.args.vocab_size
    logits = [model(toks, torch.arange(6), cache).logits[-1]]
    out: list[int] = []
    for i in range(steps):
        out.append(int(logits[-1].argmax()))
        logits.append(model(torch.tensor([out[-1]]), torch.tensor([6 + i]), cache).logits[-1])
    return out, torch.stack(logits)


def _packed_bytes(path) -> int:
    """The bytes of a packing's parts (the file adds alignment between them)."""
    size = {"U8": 1, "F16": 2, "F32": 4}
    with safe_open(str(path), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) * size[f.get_slice(k).get_dtype()]
                   for k in f.keys() if not k.endswith(".meta"))


@pytest.mark.parametrize("kind,fmt,ratio", [("Q4_0", "q40", 4.5 / 10), ("Q5_0", "q50", 5.5 / 10),
                                            ("Q8_0", "q80", 8.5 / 10)])
def test_a_legacy_type_decodes_in_its_own_bits_bit_for_bit_as_it_did_in_q8b(tmp_path, home, monkeypatch, kind, fmt,
                                                                            ratio):
    """The same file pulled by the earlier table (kind -> q8b, 10 bits a weight) and by this one (its own bits:
    Q4_0 -> q40 at 4.5, Q5_0 -> q50 at 5.5, Q8_0 -> q80 at 8.5): the same greedy tokens and logits, bit for bit,
    from a bundle that much smaller."""
    bundles = {}
    for f in ("q8b", fmt):
        path, _ = write_tiny_gguf(tmp_path / f"{f}.gguf", "qwen2", seed=3, linear_type=kind, **DIMS)
        with monkeypatch.context() as m:
            m.setitem(POLICY, kind, Rule(f, exact=True))
            bundles[f] = pull(str(path), progress=False, log=_quiet).bundle
        rows = read_manifest(bundles[f]).packing["mixed"]
        assert [(r["source_type"], r["format"], r["err2"]) for r in rows] == [(kind, f, 0.0)]
    assert POLICY[kind].format == fmt
    sizes = {f: _packed_bytes(b / "weights-mixed.safetensors") for f, b in bundles.items()}
    assert ratio - 0.01 < sizes[fmt] / sizes["q8b"] < ratio + 0.01, sizes
    old, new = load_model(bundles["q8b"], "mixed"), load_model(bundles[fmt], "mixed")
    assert new.layers[0].native is not None                         # the compiled block, with its descriptors
    (tok_old, log_old), (tok_new, log_new) = _greedy(old), _greedy(new)
    assert tok_new == tok_old and torch.equal(log_new, log_old)


LLAMA_QUANTIZE = os.environ.get("SPECZOO_LLAMA_QUANTIZE") or shutil.which("llama-quantize")


@pytest.mark.skipif(LLAMA_QUANTIZE is None, reason="llama.cpp's llama-quantize not found ($SPECZOO_LLAMA_QUANTIZE "
                                                   "or on PATH)")
@pytest.mark.parametrize("kind,ftype", [("Q2_K", "Q2_K"), ("Q3_K", "Q3_K_S"), ("Q5_K", "Q5_K_S"), ("Q6_K", "Q6_K"),
                                        ("IQ4_NL", "IQ4_NL"), ("IQ4_XS", "IQ4_XS"), ("IQ3_S", "IQ3_S")])
def test_types_from_llama_quantize_pull_and_run_within_their_bound(tmp_path, home, kind, ftype):
    """The same on blocks llama.cpp's own quantizer made."""
    f32, _ = write_tiny_gguf(tmp_path / "f32.gguf", "qwen2", seed=3, linear_type="F32", **DIMS)
    out = tmp_path / f"{kind}.gguf"
    subprocess.run([LLAMA_QUANTIZE, "--pure", str(f32), str(out), ftype, "1"], check=True, capture_output=True)
    _check_pulled(out, kind)
