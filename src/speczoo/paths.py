"""Where speczoo keeps its files on disk (bundles, assembled GGUFs, compiled kernels).

Never creates anything at import time; callers ask for a directory and it is made then.
"""

import os
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
