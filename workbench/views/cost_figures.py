"""Figures for ``wb.shapes.cost``: verify time against budget on a GPU roofline beside a measured CPU curve,
and the predicted speedup per budget. Pure data -> plotly figure."""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.views.figures import PALETTE, empty_figure


def verify_cost_figure(curves: Sequence[Mapping] | Mapping, measured: Mapping[int, float] | None = None,
                       measured_label: str = "CPU, measured") -> go.Figure:
    """Left: TARGET_VERIFY roofline time / DECODE time against budget, one line per ``CostTable.curve()``
    (GPU, batch, ...), with the 1.1x "free" line and each curve's free budget. Right: ``measured``
    {budget: verify seconds} of a real run, relative to its budget-0 (or smallest) verify: the other regime,
    where a forward is compute-bound and every node costs time."""
    curves = [curves] if isinstance(curves, Mapping) else list(curves)
    if not curves:
        return empty_figure("no cost curves")
    right = "verify time, measured on this CPU (compute-bound: the other regime)"
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "verify / decode on the GPU roofline (memory-bound: nodes ride along)", right if measured else ""))
    for i, c in enumerate(curves):
        color = PALETTE[i % len(PALETTE)]
        name = html.escape(f"{c['model']} · {c['gpu']} · batch {c['batch']} · prompt {c['prompt_len']}")
        x = [max(b, 0.5) for b in c["budget"]]  # budget 0 (plain decode's shape) drawn at 0.5 on the log axis
        ratio = [s / c["decode_s"] for s in c["seconds"]]
        fig.add_trace(go.Scatter(x=x, y=ratio, mode="lines+markers", name=name, line=dict(color=color),
                                 customdata=[[b, s * 1e3] for b, s in zip(c["budget"], c["seconds"])],
                                 hovertemplate="B=%{customdata[0]}: %{customdata[1]:.2f} ms, %{y:.2f}x decode"
                                               "<extra></extra>"), row=1, col=1)
        fb = c["free_budget"]
        fig.add_trace(go.Scatter(x=[max(fb, 0.5)], y=[c["free_factor"]], mode="markers", showlegend=False,
                                 marker=dict(color=color, size=11, symbol="diamond"),
                                 hovertemplate=f"free budget {fb}<extra>{name}</extra>"), row=1, col=1)
    fig.add_hline(y=curves[0]["free_factor"], line=dict(color="#9e9e9e", dash="dash"), row=1, col=1,
                  annotation_text=f"{curves[0]['free_factor']}x decode", annotation_position="top left")
    if measured:
        pts = sorted((int(b), float(s)) for b, s in measured.items())
        base = pts[0][1]
        fig.add_trace(go.Scatter(x=[max(b, 0.5) for b, _ in pts], y=[s / base for _, s in pts], mode="lines+markers",
                                 name=html.escape(f"{measured_label} (other regime)"),
                                 line=dict(color="#222", dash="dot"),
                                 customdata=[[b, s * 1e3] for b, s in pts],
                                 hovertemplate="B=%{customdata[0]}: %{customdata[1]:.2f} ms<extra>measured</extra>"),
                      row=1, col=2)
        fig.update_yaxes(title_text=f"verify / verify at B={pts[0][0]}", row=1, col=2)
    fig.update_xaxes(type="log", title_text="budget B (tree nodes; verify = 1 + B tokens per request)")
    fig.update_yaxes(title_text="verify time / decode time", row=1, col=1)
    fig.update_layout(height=420, plot_bgcolor="white", margin=dict(l=50, r=20, t=70, b=40),
                      legend=dict(orientation="h", y=-0.25), title="what a tree verify costs")
    return fig


def speedup_figure(speedups: Sequence | object) -> go.Figure:
    """Predicted DDTree speedup over AR against budget, one line per ``Speedup`` (its best budget marked)."""
    items = speedups if isinstance(speedups, (list, tuple)) else [speedups]
    if not items:
        return empty_figure("no predictions")
    for sp in items:
        if not (hasattr(sp, "rows") and hasattr(sp, "best") and hasattr(sp, "settings")):
            raise TypeError(f"speedup_figure draws Speedup predictions, got {type(sp).__name__}: pass "
                            "table.speedup(acceptance) (wb.shapes.speedup); a CostTable's own curve is "
                            "verify_cost_figure(table.curve())")
    fig = go.Figure()
    for i, sp in enumerate(items):
        color = PALETTE[i % len(PALETTE)]
        s = sp.settings
        name = html.escape(f"{s['model']} · {s['gpu']} · batch {s['batch']}")
        rows = sp.rows
        fig.add_trace(go.Scatter(x=[r["budget"] for r in rows], y=[r["speedup"] for r in rows], mode="lines+markers",
                                 name=name, line=dict(color=color), customdata=[[r["tau"]] for r in rows],
                                 hovertemplate="B=%{x}: %{y:.2f}x (tau %{customdata[0]:.2f})<extra></extra>"))
        best = sp.best
        fig.add_trace(go.Scatter(x=[best["budget"]], y=[best["speedup"]], mode="markers", showlegend=False,
                                 marker=dict(color=color, size=13, symbol="star"),
                                 hovertemplate=f"best: B={best['budget']}, {best['speedup']:.2f}x"
                                               f"<extra>{name}</extra>"))
    fig.add_hline(y=1.0, line=dict(color="#9e9e9e", dash="dash"))
    fig.update_xaxes(type="log", title_text="budget B")
    fig.update_yaxes(title_text="predicted speedup over AR (roofline)")
    fig.update_layout(height=380, plot_bgcolor="white", margin=dict(l=50, r=20, t=60, b=40),
                      title="what a tree buys: tau(B) x decode / (draft + verify(B))")
    return fig
