"""Plain-text tables that stay aligned at any width: every column as wide as its widest cell.

Cells are joined with two spaces, so no value can run into its neighbour however wide it grows.
"""
from __future__ import annotations


def text_table(headers: list[str], rows: list[list[str]], indent: str = "") -> str:
    """The first column left-aligned (a label), the others right-aligned (numbers)."""
    cols = len(headers)
    for r in rows:
        if len(r) != cols:
            raise ValueError(f"a row has {len(r)} cells for {cols} columns: {r!r}")
    widths = [max([len(headers[i])] + [len(r[i]) for r in rows]) for i in range(cols)]

    def line(cells):
        return indent + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def legend(items: list[tuple[str, str]]) -> str:
    """'  name: definition' lines, one per column."""
    w = max(len(n) for n, _ in items)
    return "\n".join(f"  {n.ljust(w)}  {d}" for n, d in items)
