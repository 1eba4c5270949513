"""The shape tables' rows: lists of plain dict rows with a text ``__str__`` and an HTML ``_repr_html_``,
and the two formatters every shape table uses (``fmt_bytes``, ``fmt_shape``).

``tables.py`` fills them from recorded forwards, ``sglang_layout.py`` from SGLang's layout: both import
this module, neither imports the other's rows.
"""
from __future__ import annotations

import html


# --------------------------------------------------------------------------------------------- formatting
def fmt_bytes(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def fmt_shape(shape) -> str:
    if shape is None:
        return "None"
    return "[" + ", ".join(str(d) for d in shape) + "]"


class Rows(list):
    """A list of dict rows rendered as a text or HTML table over ``columns``."""

    columns: tuple = ()
    title: str = ""
    blank_repeats: tuple = ()  # columns shown only when they change from the row above

    def _cells(self) -> list[list[str]]:
        out, prev = [], {}
        for r in self:
            row = []
            for c in self.columns:
                v = self._cell(r, c)
                row.append("" if c in self.blank_repeats and prev.get(c) == v else v)
                prev[c] = v
            out.append(row)
        return out

    def _cell(self, row: dict, col: str) -> str:
        v = row.get(col)
        if v is None:
            return ""
        if col == "shape":
            return fmt_shape(v)
        if col == "bytes":
            return fmt_bytes(v)
        return str(v)

    def _row_style(self, row: dict) -> str:
        return ""

    def __str__(self) -> str:
        cells = self._cells()
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(self.columns)]
        line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
        out = ([self.title] if self.title else []) + [line(self.columns), line(["-" * w for w in widths])]
        return "\n".join(out + [line(r) for r in cells])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(f"<tr{self._row_style(r)}>" + "".join(f"<td style='text-align:left'>{html.escape(v)}</td>"
                                                             for v in row) + "</tr>"
                       for r, row in zip(self, self._cells()))
        cap = f"<caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>" if self.title else ""
        return f"<table>{cap}<tr>{head}</tr>{body}</table>"


class ShapeTable(Rows):
    """Rows {forward, module, layers, io, tensor, shape, dtype, device, bytes}; bytes is per tensor."""

    columns = ("forward", "module", "layers", "io", "tensor", "shape", "dtype", "device", "bytes")
    blank_repeats = ("forward",)


class LayoutTable(Rows):
    """SGLang's tensors for a forward: rows {forward, tensor, shape, dtype, bytes, ours, by, source, note}.

    ``by``: what computed the row (sglang import / sglang source / workbench rule); ``source``: the
    sglang file its rule comes from (``sglang_layout.SGLANG_RULES[row["rule"]]`` has the expression).
    """

    columns = ("forward", "tensor", "shape", "dtype", "bytes", "ours", "by", "source", "note")
    blank_repeats = ("forward",)

    def row(self, tensor: str) -> dict:
        hit = [r for r in self if r["tensor"] == tensor]
        if not hit:
            raise KeyError(f"no SGLang tensor {tensor!r}; this layout has {', '.join(r['tensor'] for r in self)}")
        return hit[0]


class CompareTable(Rows):
    """Rows {module, layers, io, tensor, <label>: {shape, dtype, bytes} or None} aligned by module name."""

    def __init__(self, rows, labels, title=""):
        super().__init__(rows)
        self.labels = tuple(labels)
        self.columns = ("module", "layers", "io", "tensor") + self.labels
        self.title = title

    def _cell(self, row, col):
        if col in self.labels:
            v = row.get(col)
            if v is None:
                return "-"  # this run has no such tensor
            if v["shape"] is None:
                return "None"  # SGLang passes None here (e.g. DFlash's verify mask)
            return f"{fmt_shape(v['shape'])} {v['dtype']} ({fmt_bytes(v['bytes'])})"
        return super()._cell(row, col)


class CheckTable(Rows):
    """Contract checks: rows {check, result (PASS/FAIL), cycles, expected, got}."""

    columns = ("check", "result", "cycles", "expected", "got")

    def _row_style(self, row: dict) -> str:
        return "" if row.get("ok", True) else " style='background:#fdd'"

    @property
    def passed(self) -> bool:
        return all(r["ok"] for r in self)

    def failures(self) -> list[dict]:
        return [r for r in self if not r["ok"]]
