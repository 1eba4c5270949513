"""Self-contained HTML: plotly.js is inlined (no CDN, opens with no network); files are written atomically."""
from __future__ import annotations

import html
from pathlib import Path

from workbench.records.files import write_text_atomic

import plotly.graph_objects as go
import plotly.io as pio


def figure_div(fig, include_plotlyjs: bool) -> str:
    """One figure as an HTML fragment; plotly.js inlined into it when ``include_plotlyjs``."""
    if isinstance(fig, go.FigureWidget):
        fig = go.Figure(fig)
    return pio.to_html(fig, include_plotlyjs=bool(include_plotlyjs), full_html=False,
                       config={"displaylogo": False, "responsive": True})


def page(title: str, parts: list, style: str = "") -> str:
    """A full HTML page from parts: plotly figures and raw HTML strings. plotly.js is inlined once."""
    body = []
    js_done = False
    for p in parts:
        if isinstance(p, go.Figure):
            body.append(figure_div(p, include_plotlyjs=not js_done))
            js_done = True
        else:
            body.append(str(p))
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}"
        f"h1,h2{{font-weight:600}}{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def to_html(obj, title: str | None = None) -> str:
    """A figure (Figure or FigureWidget) or a Stepper's current view as one self-contained HTML page."""
    if isinstance(obj, go.Figure):
        return page(title or (obj.layout.title.text or "figure"), [obj])
    if hasattr(obj, "export_parts"):  # a Stepper
        return page(title or "workbench stepper", obj.export_parts())
    raise TypeError(f"cannot export {type(obj).__name__}; give a plotly figure or a views.Stepper")


def save_html(fig_or_stepper, path, title: str | None = None) -> Path:
    """Write ``fig_or_stepper`` to ``path`` as self-contained HTML (plotly.js inline). Returns the path."""
    return write_text_atomic(path, to_html(fig_or_stepper, title))
