"""join_rows: packed parts that lie end to end in one storage join as a view (no copy), any others as
torch.cat's copy; the values are torch.cat's either way, and a compiled run joined from views computes
what the separate modules compute, bit for bit."""

from __future__ import annotations

import torch

from speczoo.kernels.backends import get_backend
from speczoo.kernels.pack import join_rows
from speczoo.kernels.quantized import concat_native


def test_parts_end_to_end_in_one_storage_join_as_a_view():
    whole = torch.arange(7 * 3 * 4, dtype=torch.float32)
    parts = [whole[0:24].view(2, 3, 4), whole[24:36].view(1, 3, 4), whole[36:84].view(4, 3, 4)]
    joined = join_rows(parts)
    assert torch.equal(joined, torch.cat(parts)) and joined.is_contiguous()
    assert joined.data_ptr() == whole.data_ptr()                       # a view: nothing copied
    assert joined.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()


def test_parts_apart_out_of_order_or_of_other_storages_are_copied():
    whole = torch.arange(48, dtype=torch.float32)
    for parts in ([whole[0:12].view(1, 12), whole[24:36].view(1, 12)],                 # a gap
                  [whole[12:24].view(1, 12), whole[0:12].view(1, 12)],                 # out of order
                  [whole[0:12].view(1, 12), whole[12:24].clone().view(1, 12)]):        # another storage
        joined = join_rows(parts)
        assert torch.equal(joined, torch.cat(parts))
        assert joined.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr()


def test_a_run_joined_from_parts_end_to_end_computes_what_the_parts_compute():
    backend = get_backend("q8b")
    torch.manual_seed(0)
    weights = [torch.randn(n, 64) / 8 for n in (32, 16, 16)]
    packings = [backend.pack(w) for w in weights]
    names = [p for p in packings[0] if p != "meta"]
    # lay the parts out as a bundle does (zoo/layout.py): each part of every weight, end to end, in one buffer
    flat = torch.cat([p[name].reshape(-1).view(torch.uint8) for name in names for p in packings])
    views, at = [{} for _ in packings], 0
    for name in names:
        for p, v in zip(packings, views):
            n = p[name].numel() * p[name].element_size()
            v[name] = flat[at:at + n].view(p[name].dtype).view(p[name].shape)
            at += n
    for p, v in zip(packings, views):
        v["meta"] = p["meta"]
    mods = [backend.build(v, None) for v in views]
    run = concat_native(mods)
    assert run.w8.data_ptr() == mods[0].w8.data_ptr()                 # joined in place
    x = torch.randn(5, 64)
    assert torch.equal(run(x), torch.cat([m(x) for m in mods], dim=1))
