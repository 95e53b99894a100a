"""The packing table of a bundle as a terminal table: source type, tensors, kernel format, relative error.

Not a command itself (the CLI skips modules whose name starts with "_"). `speczoo pull` prints it after a
pull, `speczoo models --packing` for every pulled bundle. It only formats what zoo/policy.py measured.
"""

from __future__ import annotations

from rich.table import Table

from speczoo.zoo.policy import PackRow


def packing_table(rows: list[PackRow], title: str) -> Table:
    t = Table(title=title, title_justify="left", caption="relative error: ||packed - source|| / ||source|| "
                                                         "over the type's weights", caption_justify="left")
    for col, justify in (("source type", "left"), ("tensors", "right"), ("weights", "right"),
                         ("kernel format", "left"), ("relative error", "right")):
        t.add_column(col, justify=justify)
    for r in rows:
        err = f"{r.relative_error:.3%}"
        t.add_row(r.source_type, str(r.tensors), f"{r.weights / 1e6:,.1f} M", r.format,
                  err + (" (exact)" if r.exact and r.err2 == 0 else ""))
    return t
