"""FileRows: rows of a safetensors tensor read from the file equal the tensor's rows (any dtype, any id order,
duplicates, negative ids, spans); the file is never memory-mapped, so looking rows up adds no file pages to
the process; a bad id or a truncated file is a clear error.
"""

from __future__ import annotations

import copy
import gc
import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

from speczoo.models.file_rows import FileRows, tensor_location


def _file(tmp_path, tensors: dict[str, torch.Tensor], name: str = "t"):
    path = tmp_path / f"{name}.safetensors"
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float16, torch.float32])
def test_rows_equal_the_tensors_rows(tmp_path, dtype):
    g = torch.Generator().manual_seed(0)
    table = (torch.randn(50, 24, generator=g) * 40).to(dtype)
    path = _file(tmp_path, {"norm": torch.ones(7), "table": table, "after": torch.zeros(3, 3)})
    rows = FileRows(path, "table")
    assert rows.shape == table.shape and rows.dtype == dtype and len(rows) == 50 and rows.dim() == 2
    for ids in (torch.tensor([3, 0, 49, 3, -1]), torch.randint(0, 50, (200,), generator=g), torch.arange(50),
                torch.zeros(0, dtype=torch.long), torch.tensor([7], dtype=torch.int32)):
        want = table[ids.long()]
        got = rows[ids]
        assert got.dtype == dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), ids
    assert torch.equal(rows[:1], table[:1]) and torch.equal(rows[10:13], table[10:13])
    assert torch.equal(rows.read(), table)


def test_the_header_names_where_each_tensor_lies(tmp_path):
    path = _file(tmp_path, {"a": torch.arange(6, dtype=torch.int64).reshape(2, 3), "b": torch.ones(4, 2)})
    for name in ("a", "b"):
        offset, shape, dtype = tensor_location(path, name)
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(shape.numel() * dtype.itemsize)
        assert shape == (2, 3) if name == "a" else shape == (4, 2)
        want = torch.arange(6, dtype=torch.int64) if name == "a" else torch.ones(8)
        assert torch.equal(torch.frombuffer(bytearray(data), dtype=dtype), want)


def test_the_file_is_never_memory_mapped(tmp_path):
    """A memory map would count each looked-up row's whole page-cache folio as the process's RSS."""
    path = _file(tmp_path, {"table": torch.randint(0, 255, (4096, 1024), dtype=torch.uint8)})
    rows = FileRows(path, "table")
    rows[torch.randint(0, 4096, (300,))]
    rows.read()
    with open("/proc/self/maps") as f:
        assert str(path) not in f.read()


def test_a_copy_reads_the_same_rows_on_its_own_descriptor(tmp_path):
    table = torch.arange(60, dtype=torch.float32).reshape(20, 3)
    rows = FileRows(_file(tmp_path, {"table": table}), "table")
    for twin in (copy.copy(rows), copy.deepcopy(rows), pickle.loads(pickle.dumps(rows))):
        assert twin._fd != rows._fd and torch.equal(twin[torch.tensor([4, 19])], table[[4, 19]])
        del twin
        gc.collect()
    assert torch.equal(rows.read(), table)


def test_a_bad_id_or_a_truncated_file_is_a_clear_error(tmp_path):
    path = _file(tmp_path, {"table": torch.ones(10, 8)})
    rows = FileRows(path, "table")
    for bad in (torch.tensor([10]), torch.tensor([-11])):
        with pytest.raises(IndexError, match="outside"):
            rows[bad]
    with pytest.raises(ValueError, match="by rows"):
        FileRows(_file(tmp_path, {"flat": torch.ones(10)}, "flat"), "flat")
    os.truncate(path, os.path.getsize(path) - 16)
    with pytest.raises(EOFError, match="truncated"):
        rows[torch.tensor([9])]
