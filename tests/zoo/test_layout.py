"""A bundle's packing holds the weights a model joins at load (q|k|v, gate|up) part by part, end to end,
so that the loaded model's joined runs are views of the memory-mapped file, not anonymous copies: the
weights are held once, in the page cache, as llama.cpp holds its GGUF. A packing written member by member
(before this layout) still loads, to the same bits, and a plain pull lays it out. The `real` test holds
the loaded 0.5B's anonymous memory to a small share of its bundle, which any dense copy of its weights
(a joined run copied, the fp32 embedding, a packed tied head) would exceed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tiny_gguf import write_tiny_gguf

from speczoo.cache import KVCache
from speczoo.kernels.quantized import is_compiled
from speczoo.models.mapped import read_header, read_mapped
from speczoo.zoo import bundle as B
from speczoo.zoo.layout import HOLD_MAX, PackedWriter, joined_end_to_end, lay_out
from speczoo.zoo.pull import pull
from speczoo.zoo.weights import load_model

BACKEND = "mixed"
# Q8_0 linears pack in q80, Q4_K in q4 (dims of 256 for the K-quant's super-blocks)
TYPES = {"Q8_0": {}, "Q4_K": dict(dim=256, n_heads=4, head_dim=64, n_kv_heads=2, ffn_dim=256, n_layers=2)}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("SPECZOO_HOME", str(h))
    return h


def _quiet(msg: str) -> None:
    pass


def _pulled(tmp_path, linear_type: str):
    path, _ = write_tiny_gguf(tmp_path / f"{linear_type}.gguf", "qwen2", linear_type=linear_type,
                              **TYPES[linear_type])
    return path, pull(str(path), backend=BACKEND, progress=False, log=_quiet).bundle


def _member_by_member(packed_file) -> None:
    """Rewrite a packing in the order pulls wrote before the layout: each weight's parts together."""
    tensors = {k: v.clone() for k, v in read_mapped(packed_file).items()}
    meta = read_header(packed_file)[1]["__metadata__"]
    tmp = packed_file.with_name("old-order.tmp")
    w = B.SafetensorsWriter(tmp)
    for k in sorted(tensors):
        w.add(k, tensors[k])
    w.close({k: v for k, v in meta.items() if k != "format"})
    os.replace(tmp, packed_file)
    assert not joined_end_to_end(packed_file)


def _logits(model) -> torch.Tensor:
    tokens = torch.arange(3, 12) % model.args.vocab_size
    return model(tokens, torch.arange(9), KVCache(model.args, max_seq=32)).logits


PARTS = ("w8", "sb", "mb", "qs", "sc", "mn", "dd", "ql", "qh", "sd")   # of q8b, q8bm, q4, q6, q40, q50, q80


def _parts(m) -> list[torch.Tensor]:
    return [t for name in PARTS if isinstance(t := getattr(m, name, None), torch.Tensor)]


def _joined_runs(model) -> list:
    """The compiled runs that join two or more linears (a block's q|k|v, its gate|up)."""
    return [run for layer in model.layers for fused in (layer.qkv, layer.mlp.gate_up)
            for run, sizes in zip(fused.runs, fused.run_sizes) if len(sizes) > 1]


@pytest.mark.parametrize("linear_type", list(TYPES))
def test_a_pulled_model_joins_its_runs_in_place(tmp_path, linear_type):
    _, bundle = _pulled(tmp_path, linear_type)
    packed_file = bundle / B.packed_weights_file(BACKEND)
    assert joined_end_to_end(packed_file)
    model = load_model(bundle, BACKEND)
    size = packed_file.stat().st_size
    assert len(_joined_runs(model)) == 2 * model.args.n_layers
    compiled = [m for m in model.modules() if is_compiled(m)]
    assert compiled and all(_parts(m) for m in compiled)
    for m in compiled:                                   # every packed part a view of the file's one mapping
        for t in _parts(m):
            assert t.untyped_storage().nbytes() == size, f"a part of a {type(m).__name__} is a copy"


@pytest.mark.parametrize("linear_type", list(TYPES))
def test_a_packing_written_member_by_member_loads_the_same_and_a_pull_lays_it_out(tmp_path, linear_type):
    path, bundle = _pulled(tmp_path, linear_type)
    packed_file = bundle / B.packed_weights_file(BACKEND)
    laid_out = _logits(load_model(bundle, BACKEND))
    before = {k: v.clone() for k, v in read_mapped(packed_file).items()}
    _member_by_member(packed_file)
    old = load_model(bundle, BACKEND)
    assert torch.equal(_logits(old), laid_out)                     # copies where views were: the same bits
    assert all(_parts(run)[0].untyped_storage().nbytes() != packed_file.stat().st_size for run in _joined_runs(old))
    r = pull(str(path), backend=BACKEND, progress=False, log=_quiet)
    assert r.action == "slimmed" and "laid out" in r.message
    assert joined_end_to_end(packed_file)
    after = read_mapped(packed_file)
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert B.check_bundle(bundle, hash_source=False).ok
    assert torch.equal(_logits(load_model(bundle, BACKEND)), laid_out)
    assert pull(str(path), backend=BACKEND, progress=False, log=_quiet).action == "already"


class _Recorder:
    def __init__(self):
        self.names: list[str] = []

    def add(self, name, tensor):
        self.names.append(name)


def test_the_writer_holds_a_group_until_it_is_whole_and_gives_up_past_the_cap():
    rec = _Recorder()
    part = {"w8": torch.zeros(1), "sb": torch.zeros(1)}
    w = PackedWriter(rec, ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight"])
    for n in ("blk.0.attn_k.weight", "blk.0.attn_output.weight", "blk.0.attn_v.weight", "blk.0.attn_q.weight"):
        w.add(n, part)
    assert rec.names == ["blk.0.attn_output.weight.w8", "blk.0.attn_output.weight.sb",
                         "blk.0.attn_q.weight.w8", "blk.0.attn_k.weight.w8", "blk.0.attn_v.weight.w8",
                         "blk.0.attn_q.weight.sb", "blk.0.attn_k.weight.sb", "blk.0.attn_v.weight.sb"]
    rec = _Recorder()
    names = [f"blk.{i}.attn_q.weight" for i in range(HOLD_MAX + 1)] + [f"blk.{i}.attn_k.weight" for i in range(HOLD_MAX + 1)]
    w = PackedWriter(rec, names)
    for n in names[:HOLD_MAX + 1]:                  # q of every block first: more than the cap waits
        w.add(n, {"w8": torch.zeros(1)})
    assert rec.names == [f"{n}.w8" for n in names[:HOLD_MAX + 1]]


@pytest.mark.real
def test_the_loaded_real_model_holds_no_dense_copy(session_home):
    """In a fresh process: the anonymous memory that loading the 0.5B and decoding with it adds stays under a
    tenth of its bundle (its weights are file-backed views). A dense copy of any big part would exceed it:
    the joined q|k|v and gate|up (~290 MB), the fp32 embedding (545 MB), its tied head packed at load."""
    from real_models import QWEN_NAME
    from speczoo.zoo.bundle import find_bundle

    bundle = find_bundle(QWEN_NAME)
    size = B.dir_size(bundle)
    code = textwrap.dedent(f"""
        import json, torch
        def anon():
            return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon"))
        from speczoo.cache import KVCache
        from speczoo.zoo.weights import load_model
        a0 = anon()
        model = load_model({str(bundle)!r}, "mixed")
        a1 = anon()
        cache = KVCache(model.args, max_seq=64, dtype=torch.float16)
        model(torch.arange(10, 26), torch.arange(16), cache)
        for i in range(4):
            model(torch.tensor([30 + i]), torch.tensor([16 + i]), cache)
        print(json.dumps({{"load": a1 - a0, "decode": anon() - a0}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown = json.loads(out.stdout.strip().splitlines()[-1])
    assert grown["load"] < 0.1 * size and grown["decode"] < 0.1 * size, (
        f"{QWEN_NAME}: loading added {grown['load'] / 1e6:.0f} MB and decoding {grown['decode'] / 1e6:.0f} MB of "
        f"anonymous memory, over a tenth of its {size / 1e6:.0f} MB bundle: something holds a dense copy")
