"""runtime.load without a backend named: a bundle that stores no packing (pulled with `--backend fp32`) loads
with the backend that packs at load, and a bundle packed by an earlier policy table loads as it is, with a
note saying how to re-pack it. (The default backend's choice itself: tests/kernels/test_default_backend.py.)"""

from __future__ import annotations

import json

import torch
from tiny_gguf import write_tiny_gguf

from speczoo import runtime
from speczoo.cache import KVCache
from speczoo.zoo.bundle import MANIFEST_FILE
from speczoo.zoo.pull import pull


def _quiet(msg: str) -> None:
    pass


def _logits(m) -> torch.Tensor:
    ids = torch.tensor([5, 9, 2, 7])
    return m.model(ids, torch.arange(4), KVCache(m.args, max_seq=8)).logits      # [S, V]


def test_a_bundle_pulled_with_fp32_loads_without_naming_a_backend(tmp_path, home):
    """Issue #28's bug: such a bundle loaded the default `mixed`, whose packing it does not store."""
    gguf_path, _ = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    pull(str(gguf_path), backend="fp32", progress=False, log=_quiet)
    loaded = runtime.load(str(gguf_path))
    assert loaded.backend == "fp32"
    assert torch.equal(_logits(loaded), _logits(runtime.load(str(gguf_path), backend="fp32")))


def test_a_packing_of_an_earlier_table_loads_with_a_note_once(tmp_path, home, capsys, monkeypatch):
    """A bundle whose manifest says Q4_1 went to q8b (the table before q8bm) loads as it is and says once
    that a plain pull re-packs it; a current one says nothing."""
    monkeypatch.setattr(runtime, "_NOTED", set())
    gguf_path, _ = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", linear_type="Q4_1")
    bundle = pull(str(gguf_path), progress=False, log=_quiet).bundle
    runtime.load(str(gguf_path))
    assert capsys.readouterr().err == ""
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    for row in manifest["packing"]["mixed"]:
        row["format"] = "q8b"
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest))
    runtime.load(str(gguf_path))
    runtime.load(str(gguf_path))
    err = capsys.readouterr().err
    assert err.count("Q4_1 in q8b, held in q8bm now") == 1 and f"`speczoo pull {gguf_path}`" in err
