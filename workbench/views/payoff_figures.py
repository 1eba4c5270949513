"""Figures for pays-off's results and the tree policies' counts: a value per policy and batch (static or
refilled) with its interval, and the next slot's top-1 by path state per scorer. Pure data -> plotly figure.

    wb.views.payoff_figure(res)               # a PaysOff, its to_dict(), or `pays-off --json`'s object
    wb.views.by_policy_figure({"batch 1": {"DDTree(16)": (3.1, 2.8, 3.4)}}, "tokens per target forward")
    wb.views.next_top1_figure(acc)            # workbench.train.cond_head.accuracy_table's result
"""
from __future__ import annotations

import html
from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.views.figures import PALETTE, empty_figure

STATES = {"spine": "on the spine", "sibling": "right after a sibling", "off": "below a sibling"}
SCORERS = {"marginal": "drafter's marginal (as drafted)", "table": "successor table", "learned": "learned head"}


def bar_traces(series: Mapping[str, Mapping[str, tuple]], fmt: str, legend: bool = True) -> list:
    """One bar trace per group (``series``: group -> policy -> (value, low, high); low/high None: no interval),
    the interval as asymmetric error bars."""
    traces = []
    for i, (group, rows) in enumerate(series.items()):
        labels = list(rows)
        vals = [rows[k][0] for k in labels]
        up = [None if rows[k][2] is None else rows[k][2] - rows[k][0] for k in labels]
        down = [None if rows[k][1] is None else rows[k][0] - rows[k][1] for k in labels]
        esc = html.escape(group)
        traces.append(go.Bar(
            x=[html.escape(k) for k in labels], y=vals, name=esc, legendgroup=esc, showlegend=legend,
            marker_color=PALETTE[i % len(PALETTE)],
            error_y=dict(type="data", symmetric=False, array=up, arrayminus=down,
                         visible=any(u is not None for u in up)),
            hovertemplate=f"{esc}, %{{x}}: %{{y:{fmt}}}<extra></extra>"))
    return traces


def by_policy_figure(series: Mapping[str, Mapping[str, tuple]], title: str, ytitle: str | None = None,
                     reference: float | None = None) -> go.Figure:
    """Grouped bars: series {group, e.g. 'batch 8, refilled': {policy label: (value, low, high)}}, one colour per
    group, its interval as error bars; ``reference``: a dashed line (1.0 for a ratio)."""
    if not any(series.values()):
        return empty_figure(f"{title}: nothing measured")
    fig = go.Figure(bar_traces(series, ".2f"))
    if reference is not None:
        fig.add_hline(y=reference, line=dict(color="#555", dash="dash", width=1))
    fig.update_layout(barmode="group", height=380, plot_bgcolor="white", title=title, yaxis_title=ytitle or title,
                      margin=dict(l=60, r=20, t=60, b=90), legend=dict(orientation="h", y=-0.3))
    return fig


def payoff_series(res) -> tuple[dict, dict]:
    """(tokens per target forward, measured tokens/s over DFlash's) as ``by_policy_figure`` series, one group per
    batch size and mode. Tokens per forward is pooled over every unit (an exact count: no interval); the speed is
    the median of the per-unit paired ratios, its interval their interquartile range (DFlash: 1, none)."""
    d = res if isinstance(res, Mapping) else res.to_dict()
    d = d.get("greedy", d)  # `pays-off --json` holds the greedy result and the sampled one
    groups = [(f"batch {b}" + (", static" if b in d.get("refilled", {}) else ""), v) for b, v in d["batches"].items()]
    groups += [(f"batch {b}, refilled", v) for b, v in d.get("refilled", {}).items()]
    tpf, speed = {}, {}
    for name, v in groups:
        tpf[name] = {r["label"]: (r["tokens_per_forward"], None, None) for r in v["shapes"]}
        speed[name] = {}
        for r in v["shapes"]:
            m = r.get("measured_vs_chain")
            if m:
                speed[name][r["label"]] = (m["median"], *m["iqr"])
            elif r["family"] == "chain":
                speed[name][r["label"]] = (1.0, None, None)
    return tpf, speed


def payoff_figure(res) -> go.Figure:
    """pays-off's result as two panels over its shapes: tokens per target forward, and measured tokens/s over
    DFlash's with its interquartile range over units, one colour per batch size and mode (static, refilled)."""
    tpf, speed = payoff_series(res)
    if not any(tpf.values()):
        return empty_figure("pays-off measured no shape")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("tokens per target forward", "tokens/s x DFlash (median, IQR over units)"))
    for t in bar_traces(tpf, ".2f"):
        fig.add_trace(t, row=1, col=1)
    for t in bar_traces(speed, ".2f", legend=False):
        fig.add_trace(t, row=2, col=1)
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dash", width=1), row=2, col=1)
    fig.update_layout(barmode="group", height=560, plot_bgcolor="white", title="pays-off: acceptance and speed",
                      margin=dict(l=60, r=20, t=80, b=90), legend=dict(orientation="h", y=-0.15))
    return fig


def next_top1_figure(acc: Mapping[str, Mapping[str, Mapping]]) -> go.Figure:
    """Next-slot top-1 by path state (acc {scorer: {state: {"slots", "top1"}}}, scorers 'marginal', 'table',
    'learned'): how often each scorer's best candidate, given the target's previous token, is the target's
    token, one group per path state above the slot."""
    series = {}
    for who, states in acc.items():
        series[SCORERS.get(who, who)] = {f"{STATES.get(s, s)} (n={v['slots']})": (100 * v["top1"], None, None)
                                         for s, v in states.items() if v["top1"] is not None}
    fig = by_policy_figure(series, "next slot's top-1 by path state", "top-1 is the target's token (%)")
    fig.update_yaxes(range=[0, 100])
    return fig
