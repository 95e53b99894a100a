"""The fast packers of kernels/pack.py give, byte for byte, the packings of the packers they replaced
(tests/pack_oracle.py): bundles store packings, so a packer may get faster but never change a byte.

Weights: random of several shapes (K not a multiple of 256 or 32, N not of 16), and adversarial ones:
all zeros, zero rows and groups, constant groups, ties (values on the half-steps of the grid),
huge and tiny ranges, denormals, a weight that came from a q4 grid, and signed zeros.
"""

from __future__ import annotations

import pytest
import torch
from pack_oracle import old_pack_q4, old_pack_q8

from speczoo.kernels.pack import pack_q4, pack_q8


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g)

    w = {"randn 64x256": r(64, 256), "randn 37x896": r(37, 896) * 0.02, "randn 16x50": r(16, 50),
         "randn 300x520": r(300, 520), "zeros": torch.zeros(32, 256), "minus zeros": -torch.zeros(17, 64)}
    z = r(48, 512)
    z[3] = 0.0                                                  # a zero row
    z[5, 32:64] = 0.0                                           # a zero group
    z[7, 64:96] = 0.25                                          # constant groups: positive, negative
    z[9, 96:128] = -3.0
    z[11, :256] = 1e-3                                          # a constant super-block
    w["zero and constant groups"] = z
    t = torch.randint(-8, 8, (40, 256), generator=g).float() / 2          # many exact ties on the grids
    t[::3] += 0.25
    w["ties"] = t
    h = r(32, 512)
    h[:, ::37] *= 1e6                                           # huge outliers
    h[4] *= 1e-30                                               # tiny rows
    h[6, :100] = 1e-41                                          # denormals
    w["huge and tiny ranges"] = h
    step = torch.randint(0, 16, (64, 512), generator=g).float()
    w["on a q4 grid"] = step * 0.01 - 0.07                      # what a Q4_K tensor dequantizes to
    w["one nonzero per group"] = torch.zeros(16, 256).index_fill_(1, torch.arange(0, 256, 32), 2.5)
    return w


WEIGHTS = _weights()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                    and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


@pytest.mark.parametrize("name", sorted(WEIGHTS))
def test_pack_q8_gives_the_oracles_bytes(name):
    assert _same(pack_q8(WEIGHTS[name]), old_pack_q8(WEIGHTS[name]))


@pytest.mark.parametrize("name", sorted(WEIGHTS))
def test_pack_q4_gives_the_oracles_bytes(name):
    assert _same(pack_q4(WEIGHTS[name]), old_pack_q4(WEIGHTS[name]))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("pack", [pack_q8, pack_q4])
def test_a_nan_or_inf_anywhere_is_refused(pack, value):
    w = torch.randn(1100, 64)
    w[1090, 7] = value                                          # in the last row chunk of pack_q8
    with pytest.raises(ValueError, match="NaN or inf"):
        pack(w)


@pytest.mark.parametrize("name", ["randn 300x520", "zero and constant groups", "ties", "randn 37x896"])
def test_chunk_boundaries_change_no_byte(name, monkeypatch):
    """Rows are packed in chunks; any chunk size (here: a few rows, not dividing N) gives the same bytes."""
    from speczoo.kernels import pack
    monkeypatch.setattr(pack, "_Q8_ROW_CHUNK", 7)                  # not a multiple of the 16-row strip
    monkeypatch.setattr(pack, "_Q4_CHUNK", 3 * 1024)             # 1 to 4 rows a chunk, by K
    assert _same(pack_q8(WEIGHTS[name]), old_pack_q8(WEIGHTS[name]))
    assert _same(pack_q4(WEIGHTS[name]), old_pack_q4(WEIGHTS[name]))


def test_packings_of_row_blocks_join_into_the_packing_of_all_rows():
    from speczoo.kernels.pack import concat_rows
    w = WEIGHTS["randn 300x520"]
    for pack in (pack_q8, pack_q4):
        assert _same(concat_rows([pack(w[:64]), pack(w[64:288]), pack(w[288:])]), pack(w))
    with pytest.raises(ValueError, match="do not join"):
        concat_rows([pack_q8(w[:40]), pack_q8(w[40:])])
