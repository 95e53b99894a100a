"""read_mapped: a .safetensors file as one private memory map, each tensor a view of it, equal to what
safetensors itself reads; a tensor at an offset its element type cannot view is copied out, one that lies
outside the file is an error; writing a tensor never reaches the file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from speczoo.models.mapped import read_mapped


def test_every_tensor_equals_safetensors_and_shares_one_mapping(tmp_path):
    f = tmp_path / "t.safetensors"
    tensors = {"a": torch.arange(12, dtype=torch.uint8).view(3, 4), "b": torch.randn(5, 2),
               "c": torch.tensor([7, -9], dtype=torch.int64), "d": torch.randn(3).half(),
               "e": torch.randn(4).bfloat16(), "empty": torch.zeros(0, 3)}
    save_file(tensors, str(f), metadata={"k": "v"})
    got, want = read_mapped(f), load_file(str(f))
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape and torch.equal(got[name], t)
    storages = {t.untyped_storage().data_ptr() for n, t in got.items() if n != "empty"}
    assert len(storages) == 1                                  # one mapping of the whole file
    before = f.read_bytes()
    got["b"].add_(1.0)                                         # private: never written back
    assert f.read_bytes() == before


def _raw_file(path, header: dict, data: bytes) -> None:
    """A safetensors file by hand, its header padded with spaces (as the format allows) so data starts at a
    multiple of 8."""
    raw = json.dumps(header).encode()
    raw += b" " * ((-(8 + len(raw))) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def test_a_misaligned_tensor_is_copied_and_one_past_the_end_is_an_error(tmp_path):
    f = tmp_path / "odd.safetensors"
    data = bytes([1]) + torch.tensor([1.5, -2.0]).numpy().tobytes()
    _raw_file(f, {"u": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                  "x": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}}, data)    # x at an odd byte
    got = read_mapped(f)
    assert torch.equal(got["u"], torch.tensor([1], dtype=torch.uint8))
    assert torch.equal(got["x"], torch.tensor([1.5, -2.0]))
    assert got["x"].untyped_storage().data_ptr() != got["u"].untyped_storage().data_ptr()   # copied out
    bad = tmp_path / "short.safetensors"
    _raw_file(bad, {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8))
    with pytest.raises(ValueError, match="outside the file"):
        read_mapped(bad)
