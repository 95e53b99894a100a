"""`speczoo models`: every zoo entry, every other pulled bundle and every installed EAGLE head, with
its status on disk.

Only lists: it reads manifests and hashes sources to report `verified`; it never pulls or changes a bundle.
"on disk" is what the model takes in the zoo now: its bundle, plus its assembled GGUF while the downloads
keep one (a zoo model's chunk packages live in Python's site-packages and are not counted).
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from speczoo.commands._packing import packing_table
from speczoo.zoo.bundle import bundle_dir_for, check_bundle, dir_size, list_bundles
from speczoo.zoo.heads import list_heads
from speczoo.zoo.pull import packing_tables
from speczoo.zoo.registry import DEFAULT_TARGET, MODELS
from speczoo.zoo.source import kept_gguf


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the zoo's models and what is pulled",
                       description="List every model the zoo knows and every pulled bundle: pulled or not, "
                                   "size on disk, quantization, role, and whether the source's sha256 still "
                                   "matches the bundle's manifest.")
    p.add_argument("--no-verify", action="store_true", help="skip hashing the sources (faster)")
    p.add_argument("--packing", action="store_true",
                   help="also print each pulled bundle's packing table: source type, kernel format, measured error")
    p.set_defaults(func=run)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def run(args: argparse.Namespace) -> int:
    t = Table(title="speczoo models")
    for col in ("name", "role", "arch", "quantization", "pulled", "on disk", "verified", "source"):
        t.add_column(col, no_wrap=col in ("name", "on disk"))
    shown = set()
    for m in MODELS.values():
        role = m.role + (" (default)" if m.name == DEFAULT_TARGET else "") + (f", draft: {m.draft}" if m.draft else "")
        d = bundle_dir_for(m.name)
        t.add_row(m.name, role, m.arch, m.quantization, *_status(d, args.no_verify), "zoo (PyPI chunks)")
        shown.add(d.name)
    for d in list_bundles():
        if d.name in shown:
            continue
        check = check_bundle(d, hash_source=False)
        m = check.manifest
        quant = ", ".join(f"{k}×{v}" for k, v in m.quantization.items()) if m else "?"
        t.add_row(d.name, "local", m.architecture if m else "?", quant, *_status(d, args.no_verify),
                  f"{m.source.kind}: {m.source.path}" if m else "?")
    for h in list_heads():
        c = h.config
        t.add_row(h.name, f"eagle head for {c.target} (--spec eagle:{h.name})", "eagle3",
                  f"fp32, draft vocab {c.draft_vocab}", "yes", _gb(dir_size(h.path)), "-", f"trained: {h.path}")
    # Piped output has no terminal width: do not squeeze the table to 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 220)
    console.print(t)
    if args.packing:
        for d in list_bundles():
            for backend, rows in packing_tables(d).items():
                console.print(packing_table(rows, f"{d.name}: {backend} packing"))
    return 0


def _status(d, no_verify: bool) -> tuple[str, str, str]:
    """(pulled, size on disk, verified) of a bundle directory."""
    if not d.is_dir():
        return "no", "-", "-"
    check = check_bundle(d, hash_source=not no_verify)
    if check.manifest is None:
        return "broken", _gb(dir_size(d)), f"no ({check.reason})"
    m = check.manifest
    on_disk = _gb(dir_size(d))
    if m.source.kind == "zoo" and m.name in MODELS and kept_gguf(MODELS[m.name]).is_file():
        on_disk = f"{_gb(dir_size(d) + kept_gguf(MODELS[m.name]).stat().st_size)} (with its GGUF)"
    pulled = f"yes, old layout (`speczoo pull {m.name}` slims it)" if m.legacy else "yes"
    if no_verify:
        verified = "not checked" if check.ok else f"no ({check.reason})"
    else:
        verified = "yes" if check.ok else f"no ({check.reason})"
    return pulled, on_disk, verified
