"""Figures for ``workbench.analysis``: the reliability diagram, the budget-needed curve, and tree
policies compared at equal verified-token counts. Pure data -> plotly figure."""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.views.figures import PALETTE, empty_figure


def _nan_to_none(a) -> list:
    return [None if (x is None or (isinstance(x, float) and np.isnan(x))) else float(x) for x in np.asarray(a, float)]


def reliability_figure(rel) -> go.Figure:
    """Left: empirical acceptance against drafted probability per bin (the diagonal = calibrated), bar
    widths = bins, hover = node counts. Right: acceptance rate per depth, measured and predicted."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        f"reliability ({rel.kind} probability), ECE {rel.ece:.3f}", "acceptance per depth (given reached)"))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated", line=dict(color="#9e9e9e", dash="dash"),
                             hoverinfo="skip"), row=1, col=1)
    mid = (rel.edges[:-1] + rel.edges[1:]) / 2
    has = rel.count > 0
    fig.add_trace(go.Bar(x=mid[has].tolist(), y=_nan_to_none(rel.rate[has]), width=np.diff(rel.edges)[has].tolist(),
                         name="accepted share", marker_color=PALETTE[0], opacity=0.55,
                         customdata=np.stack([rel.count[has], rel.mean_prob[has]], 1).tolist(),
                         hovertemplate="%{customdata[0]} nodes, mean p %{customdata[1]:.3f}: "
                                       "accepted %{y:.1%}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=_nan_to_none(rel.mean_prob[has]), y=_nan_to_none(rel.rate[has]), mode="markers",
                             name="bin mean", marker=dict(color=PALETTE[1], size=8), hoverinfo="skip"), row=1, col=1)
    r = rel.depth_reached > 0
    for name, ys, color in (("measured", rel.depth_rate, PALETTE[0]), ("drafter's mass on drafted children",
                                                                       rel.depth_predicted, PALETTE[1])):
        fig.add_trace(go.Scatter(x=rel.depth[r].tolist(), y=_nan_to_none(ys[r]), mode="lines+markers", name=name,
                                 line=dict(color=color), customdata=rel.depth_reached[r].tolist(),
                                 hovertemplate=f"{name}<br>depth %{{x}}: %{{y:.1%}} of %{{customdata}} cycles"
                                               "<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title_text="drafted probability", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="accepted share", range=[0, 1.02], tickformat=".0%", row=1, col=1)
    fig.update_xaxes(title_text="depth", dtick=1, row=1, col=2)
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%", row=1, col=2)
    fig.update_layout(height=400, plot_bgcolor="white", title=f"drafter reliability: {rel.nodes} nodes, "
                      f"{rel.cycles} cycles", margin=dict(l=50, r=20, t=70, b=40), meta={"ece": rel.ece})
    return fig


def budget_needed_figure(need, budgets: Sequence[int] | None = None, measured: Mapping[int, float] | None = None,
                         lengths: Sequence[int] = (1, 2, 4, 8)) -> go.Figure:
    """Left: share of cycles whose accepted path (bold) and whose continuation prefix of length L fit
    within a best-first tree of B nodes. Right: tau predicted from this one run against B, beside
    ``measured`` taus ({budget: tau}) of real runs at those budgets."""
    cur = need.curve(budgets)
    B = cur["budget"]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "reachable within budget B", "tau: predicted from one run vs measured"))
    fig.add_trace(go.Scatter(x=B, y=cur["fraction"], mode="lines+markers", name="accepted path",
                             line=dict(color="#222", width=3),
                             hovertemplate="B=%{x}: %{y:.1%} of cycles<extra>accepted path</extra>"), row=1, col=1)
    for i, L in enumerate(x for x in lengths if x in cur["by_length"]):
        fig.add_trace(go.Scatter(x=B, y=cur["by_length"][L], mode="lines", name=f"prefix of length {L}",
                                 line=dict(color=PALETTE[i % len(PALETTE)], dash="dot"),
                                 hovertemplate=f"L={L}, B=%{{x}}: %{{y:.1%}}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=B, y=cur["tau"], mode="lines+markers", name="predicted tau",
                             line=dict(color=PALETTE[0])), row=1, col=2)
    if measured:
        pts = sorted((int(b), float(t)) for b, t in measured.items())
        fig.add_trace(go.Scatter(x=[b for b, _ in pts], y=[t for _, t in pts], mode="markers", name="measured tau",
                                 marker=dict(color=PALETTE[3], size=10, symbol="x")), row=1, col=2)
    fig.update_xaxes(type="log", title_text="budget B (nodes)")
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%", title_text="share of cycles", row=1, col=1)
    fig.update_yaxes(title_text="tau (tokens / cycle)", row=1, col=2)
    fig.update_layout(height=400, plot_bgcolor="white", margin=dict(l=50, r=20, t=70, b=40),
                      title=f"budget needed: {need.cycles} cycles of {html.escape(need.policy)}")
    return fig


def policy_compare_figure(rows: Sequence[Mapping]) -> go.Figure:
    """Rows {family, verified, tau, tokens_per_s}: tau and tau per verified token against the verified
    tokens per cycle, one line per tree family."""
    if not rows:
        return empty_figure("no runs to compare")
    fams: dict[str, list] = {}
    for r in rows:
        fams.setdefault(str(r["family"]), []).append(r)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("tau (tokens / cycle)", "tau per verified token"))
    for i, (fam, rs) in enumerate(fams.items()):
        rs = sorted(rs, key=lambda r: r["verified"])
        x = [r["verified"] for r in rs]
        c = PALETTE[i % len(PALETTE)]
        esc = html.escape(fam)
        labels = [html.escape(str(r.get("policy", fam))) for r in rs]
        fig.add_trace(go.Scatter(x=x, y=[r["tau"] for r in rs], mode="lines+markers", name=esc, legendgroup=esc,
                                 line=dict(color=c), text=labels, hovertemplate="%{text}: tau %{y:.2f}<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[r["tau"] / r["verified"] for r in rs], mode="lines+markers", name=esc,
                                 legendgroup=esc, showlegend=False, line=dict(color=c), text=labels,
                                 hovertemplate="%{text}: %{y:.3f} per verified token<extra></extra>"), row=1, col=2)
    fig.update_xaxes(type="log", title_text="verified tokens per cycle (root included)")
    fig.update_layout(height=380, plot_bgcolor="white", margin=dict(l=50, r=20, t=70, b=40),
                      title="tree policies at equal verified-token counts")
    return fig
