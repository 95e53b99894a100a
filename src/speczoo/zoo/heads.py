"""Trained EAGLE-3 heads as zoo entries: directories under $SPECZOO_HOME/eagle/NAME.

A head is a speculators-format directory (config.json + model.safetensors, see decoding/eagle/io.py);
its config names the target it was trained for. Head names contain "eagle" so that they never
collide with model names and read as what they are in `speczoo models` and `--spec eagle:NAME`.
This module only finds, lists and installs head directories; it never loads weights.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from speczoo import paths
from speczoo.errors import UnknownModelError
from speczoo.decoding.eagle.config import HeadConfig
from speczoo.decoding.eagle.io import CONFIG_FILE, WEIGHTS_FILE, read_config


@dataclass(frozen=True)
class HeadEntry:
    name: str
    path: Path
    config: HeadConfig

    @property
    def target(self) -> str:
        return self.config.target


def heads_dir() -> Path:
    d = paths.home() / "eagle"
    d.mkdir(parents=True, exist_ok=True)
    return d


def check_name(name: str) -> None:
    if "eagle" not in name or "/" in name or name.startswith("."):
        raise ValueError(f"an EAGLE head's name must contain 'eagle' and be a plain directory name; got {name!r}")


def list_heads() -> list[HeadEntry]:
    out = []
    for d in sorted(heads_dir().iterdir()):
        if d.is_dir() and not d.name.startswith(".") and (d / CONFIG_FILE).is_file() and (d / WEIGHTS_FILE).is_file():
            out.append(HeadEntry(d.name, d, read_config(d)))
    return out


def heads_for(target: str) -> list[HeadEntry]:
    """Installed heads trained for the target named `target` (its zoo name or path as given)."""
    return [h for h in list_heads() if h.target == target]


def find_head(name_or_path: str) -> HeadEntry:
    """An installed head by name, or a head directory by path."""
    p = Path(name_or_path).expanduser()
    if ("/" in name_or_path or name_or_path.startswith(".")) and p.is_dir():
        return HeadEntry(p.name, p, read_config(p))
    d = heads_dir() / name_or_path
    if d.is_dir() and (d / CONFIG_FILE).is_file():
        return HeadEntry(name_or_path, d, read_config(d))
    known = [h.name for h in list_heads()]
    raise UnknownModelError(f"no EAGLE head {name_or_path!r}; installed heads: {known or 'none'} "
                            f"(train one with `speczoo train-eagle TARGET --out DIR --name NAME`)")


def install_head(src: Path, name: str) -> HeadEntry:
    """Copy the head directory `src` to $SPECZOO_HOME/eagle/NAME (replacing an older one atomically)."""
    check_name(name)
    cfg = read_config(src)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=heads_dir()))
    try:
        for f in (CONFIG_FILE, WEIGHTS_FILE):
            shutil.copy2(Path(src) / f, tmp / f)
        paths.replace_dir(tmp, heads_dir() / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return HeadEntry(name, heads_dir() / name, cfg)
