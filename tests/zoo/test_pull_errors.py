"""Bad input to `speczoo pull`: a truncated or corrupted GGUF, or one with a tensor type nobody can decode,
is a clear error naming what is wrong, and the zoo holds nothing of it afterwards (no bundle, no
temporary file or directory). A pull killed midway leaves a temporary directory that the next pull of the
same model removes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_gguf

from speczoo import cli
from speczoo.errors import SpeczooError
from speczoo.zoo.gguf import CorruptGGUFError
from speczoo.zoo.pull import pull


pytestmark = pytest.mark.usefixtures("home")


def _quiet(msg: str) -> None:
    pass


def _zoo_files(home: Path) -> list[str]:
    """Everything under the zoo's bundles and downloads (a refused pull must leave none of it)."""
    return [str(p) for d in ("bundles", "downloads") for p in (home / d).rglob("*")]


@pytest.mark.parametrize("keep", [0.0005, 0.01, 0.5, 0.999])
def test_a_truncated_gguf_is_a_clear_error_and_leaves_nothing(tmp_path, home, keep):
    path, _ = write_tiny_gguf(tmp_path / "whole.gguf", "qwen2")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(8, int(len(data) * keep))])
    with pytest.raises(CorruptGGUFError, match="truncated"):
        pull(str(cut), progress=False, log=_quiet)
    assert _zoo_files(home) == []


def test_a_corrupted_gguf_is_a_clear_error_and_leaves_nothing(tmp_path, home, capsys):
    path, _ = write_tiny_gguf(tmp_path / "whole.gguf", "qwen2")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + path.read_bytes()[4:])                      # not the GGUF magic
    with pytest.raises(CorruptGGUFError, match="not a readable GGUF"):
        pull(str(bad), progress=False, log=_quiet)
    assert cli.main(["pull", "--quiet", str(bad)]) == 2                    # the CLI: a message, no traceback
    err = capsys.readouterr().err
    assert "truncated or corrupt" in err and "Traceback" not in err
    assert _zoo_files(home) == []


@pytest.mark.parametrize("kind", ["Q8_1", "Q8_K"])
def test_a_tensor_type_nobody_decodes_is_refused_up_front(tmp_path, home, kind):
    path, _ = write_tiny_gguf(tmp_path / "odd.gguf", "qwen2", linear_type=kind, dim=256, n_heads=4, head_dim=64,
                              n_kv_heads=2, ffn_dim=512, n_layers=1)
    with pytest.raises(SpeczooError, match=rf"blk\.0\.attn_q\.weight \({kind}\).*llama-quantize"):
        pull(str(path), progress=False, log=_quiet)
    assert _zoo_files(home) == []


def test_a_pull_killed_midway_leaves_a_temporary_that_the_next_pull_removes(tmp_path, home):
    path, _ = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = home / "bundles" / f".m.tmp-{int(dead.stdout)}"                # a pid that has exited
    live = home / "bundles" / f".m.tmp-{os.getppid()}"                     # a running process's: not touched
    for d in (stale, live):
        d.mkdir(parents=True)
        (d / "weights-mixed.safetensors").write_bytes(b"half")
    pull(str(path), progress=False, log=_quiet)
    assert not stale.exists() and live.exists()
