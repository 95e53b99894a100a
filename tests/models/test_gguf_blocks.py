"""models/gguf_blocks.py: the torch decoders give gguf.quants' values bit for bit, on blocks of random bytes
(every code pattern, every scale an fp16 can hold, NaN and inf included), and Q4_K transcoded to q4 codes,
Q5_K to q8bm's and Q3_K to q8b's hold exactly the values gguf decodes. kernels/pack.py: packing q8 from rows decoded a chunk at a time,
with its error measured, gives the bytes of packing the whole weight."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from speczoo.kernels.pack import Rows, WeightError, pack_q8, unpack_q8
from speczoo.models import gguf_blocks as G
from speczoo.models.loader import dequantize


def _random_rows(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return np.random.default_rng(seed).integers(0, 256, (n, k // block * size), dtype=np.uint8)


def _same_bits(got: torch.Tensor, want: np.ndarray) -> bool:
    """Equal bits where gguf's value is finite; non-finite (NaN payloads aside) where it is not."""
    want = np.ascontiguousarray(want, dtype=np.float32)
    g = got.numpy()
    finite = np.isfinite(want)
    return g.shape == want.shape and bool((g.view(np.uint32)[finite] == want.view(np.uint32)[finite]).all()
                                          and not np.isfinite(g[~finite]).any())


@pytest.mark.parametrize("kind", G.TORCH_TYPES)
def test_torch_decoder_is_ggufs_bit_for_bit(kind):
    raw = _random_rows(kind, 40, 512, seed=len(kind))
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    assert _same_bits(G.decode(torch.from_numpy(raw), kind), want)
    assert _same_bits(dequantize(raw, kind), want)                    # chunked over rows by the loader


def test_types_without_a_torch_decoder_are_left_to_gguf():
    assert G.decode(torch.zeros(1, 66, dtype=torch.uint8), "IQ2_XXS") is None


def test_q4_k_transcode_holds_ggufs_values_exactly():
    raw = _random_rows("Q4_K", 48, 1024, seed=7)
    raw.reshape(48, -1, 144)[:, :, :4] = np.array([0.004, 0.002], dtype=np.float16).view(np.uint8)  # finite d, dmin
    codes = G.q4_k_codes(torch.from_numpy(raw))
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)
    assert _same_bits(codes.dequantize(), want)
    assert int(codes.q.max()) <= 15 and int(codes.sc.max()) <= 63 and int(codes.m.max()) <= 63


@pytest.mark.parametrize("kind,at", [("Q5_K", 0), ("Q3_K", 108)])
def test_k_quant_transcode_holds_ggufs_values_exactly(kind, at):
    raw = _random_rows(kind, 40, 1024, seed=9)
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][1]
    d = np.array([0.004, 0.002] if kind == "Q5_K" else [0.004], dtype=np.float16).view(np.uint8)
    raw.reshape(40, -1, size)[:, :, at:at + d.size] = d                      # finite d (and dmin)
    codes = G.k_quant_codes(torch.from_numpy(raw), kind)
    assert _same_bits(codes.dequantize(), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]))
    assert (codes.m is not None) == (kind == "Q5_K")
    lo, hi = (0, 31) if kind == "Q5_K" else (-4, 3)
    assert int(codes.q.min()) == lo and int(codes.q.max()) == hi
    with pytest.raises(ValueError, match="Q5_K and Q3_K"):
        G.k_quant_codes(torch.from_numpy(raw), "Q4_K")


def test_rows_decoded_a_chunk_at_a_time_pack_the_same_bytes(monkeypatch):
    from speczoo.kernels import pack
    monkeypatch.setattr(pack, "_Q8_ROW_CHUNK", 24)                      # several chunks, not strip-aligned
    raw = torch.from_numpy(_random_rows("Q6_K", 100, 512, seed=3))
    raw.view(100, -1, 210)[:, :, 208:] = torch.tensor([0x00, 0x1c], dtype=torch.uint8)   # d = 0.0039
    w = dequantize(raw, "Q6_K")
    err = WeightError()
    rows = Rows(tuple(w.shape), lambda r0, r1: dequantize(raw[r0:r1], "Q6_K"))
    got, want = pack_q8(rows, err), pack_q8(w)
    assert all(torch.equal(got[k], want[k]) for k in want)
    q, scale = unpack_q8(want)
    approx = q.float() * scale[:, None]
    assert err.relative == pytest.approx(float((approx - w).norm() / w.norm()), rel=1e-4)
    assert 0 < err.relative < 0.02
