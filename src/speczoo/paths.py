"""Where speczoo keeps its files on disk (bundles, assembled GGUFs, compiled kernels), and how a finished
directory is moved into place.

Never creates anything at import time; callers ask for a directory and it is made then.
"""

import os
import shutil
from pathlib import Path


def home() -> Path:
    """Root of speczoo's on-disk state: $SPECZOO_HOME, else ~/.cache/speczoo."""
    root = Path(os.environ.get("SPECZOO_HOME", Path.home() / ".cache" / "speczoo"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def bundles_dir() -> Path:
    d = home() / "bundles"
    d.mkdir(parents=True, exist_ok=True)
    return d


def downloads_dir() -> Path:
    d = home() / "downloads"
    d.mkdir(parents=True, exist_ok=True)
    return d


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished directory into place, replacing an old one only once the new one is there."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old)
