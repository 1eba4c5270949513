"""Pure "data -> figure" functions: each takes workbench records and returns a ``plotly.graph_objects.Figure``.

Nothing here runs a model or touches a widget; every function can be tested by
asserting on ``fig.data`` / ``fig.to_dict()``. Token text is shown with its
whitespace made visible (``␣`` for a space, ``⏎`` for a newline, ``⇥`` for a tab)
and HTML-escaped, because plotly renders a subset of HTML in labels and hovers.
"""
from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.records.cycle import STAGES, Cycle, Trace

# Colours by node outcome (colour-blind friendly: blue / orange / grey / green).
OUTCOME_COLORS = {
    "accepted": "#1f77b4",
    "agreed": "#ff7f0e",
    "rejected": "#9e9e9e",
    "bonus": "#2ca02c",
}
OUTCOME_NAMES = {
    "accepted": "accepted path",
    "agreed": "target agreed, not reached",
    "rejected": "rejected",
    "bonus": "bonus token (new)",
}
NODE_META = "nodes"  # ``trace.meta`` of every node trace in tree_figure (count nodes by it)
STAGE_COLORS = dict(zip(STAGES, ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
                                  "#8c8c8c")))

_VISIBLE = str.maketrans({" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"})


# ----------------------------------------------------------------------------- token text
@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_text(tokenizer, token_id: int) -> str:
    """Raw decoded text of one token id ("[id]" without a tokenizer; "\\xNN" for a partial UTF-8 byte)."""
    token_id = int(token_id)
    if tokenizer is None:
        return f"[{token_id}]"
    try:
        text = tokenizer.decode([token_id])
    except Exception:  # an id outside the vocabulary
        return f"[{token_id}]"
    if "\ufffd" in text:  # a piece of a multi-byte character: show its bytes
        try:
            piece = tokenizer.convert_ids_to_tokens(token_id)
            dec = _byte_decoder()
            if piece and all(ch in dec for ch in piece):
                return "".join(f"\\x{dec[ch]:02x}" for ch in piece)
        except Exception:
            pass
    return text


def visible(text: str) -> str:
    """Whitespace made visible and HTML special characters escaped."""
    return html.escape(text.translate(_VISIBLE), quote=False)


def short_label(text: str, limit: int = 10) -> str:
    """A token's text for a node label beside a marker: runs of 3+ of one whitespace character become
    '␣×16' (a run of spaces as wide as it is would overlap the next depth's labels), long text is cut
    with '…'. Visible and escaped as ``visible``; the hover keeps the full text."""
    out = re.sub(r"( |\n|\t|\r)\1{2,}", lambda m: f"{m.group(1).translate(_VISIBLE)}×{len(m.group(0))}", text)
    out = out.translate(_VISIBLE)
    if len(out) > limit:
        out = out[: limit - 1] + "…"
    return html.escape(out, quote=False)


def _labeller(tokenizer, short: bool = False):
    cache: dict[int, str] = {}

    def label(t: int) -> str:
        t = int(t)
        if t not in cache:
            raw = token_text(tokenizer, t)
            cache[t] = short_label(raw) if short else visible(raw)
        return cache[t]

    return label


# ----------------------------------------------------------------------------- tree
def tree_layout(parents: Sequence[int], order_key: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A tidy layered layout: x = depth, y = leaf slot (each leaf gets its own row; a parent sits in the
    middle of its children). Rows never collide, whatever the tree's size. Parents must precede children.

    Returns (x, y) float arrays; y grows downwards from 0 (plot with a reversed axis).
    """
    parents = np.asarray(parents, dtype=np.int64)
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[int(parents[i])].append(i)
    if order_key is not None:
        for ch in children:
            ch.sort(key=lambda j: order_key[j])
    x = np.zeros(n)
    y = np.zeros(n)
    next_leaf = 0
    # Iterative pre-order DFS: assign leaf rows in visiting order.
    stack = [0] if n else []
    visit = []
    while stack:
        i = stack.pop()
        visit.append(i)
        if parents[i] >= 0:
            x[i] = x[parents[i]] + 1
        if not children[i]:
            y[i] = next_leaf
            next_leaf += 1
        stack.extend(reversed(children[i]))
    # Post-order: a parent sits in the middle of its first and last child.
    for i in reversed(visit):
        if children[i]:
            y[i] = 0.5 * (y[children[i][0]] + y[children[i][-1]])
    return x, y


def node_outcomes(cycle: Cycle) -> list[str]:
    """Per tree node: 'accepted' (on the accepted path, root included), 'agreed' (the target chose this
    token after its parent but the walk never reached the parent) or 'rejected'."""
    parents = cycle.parents.tolist()
    tokens = cycle.tokens.tolist()
    choice = cycle.target_choice.tolist()
    acc = set(cycle.accepted_nodes.tolist())
    out = []
    for i, p in enumerate(parents):
        if i in acc or p < 0:
            out.append("accepted")
        elif tokens[i] == choice[p]:
            out.append("agreed")
        else:
            out.append("rejected")
    return out


def one_cycle(cycle, view: str) -> Cycle:
    """``cycle``, if it is one; anything else (a Trace, a Session) is refused in one line naming what to pass."""
    if isinstance(cycle, Cycle):
        return cycle
    held = " (a Trace or a session holds one per cycle: pass trace[i], e.g. trace[-1])" \
        if isinstance(cycle, Trace) or hasattr(cycle, "cycles") else ""
    raise TypeError(f"{view} draws one cycle: give a wb.Cycle{held}, got {type(cycle).__name__}")


def tree_figure(cycle: Cycle, tokenizer=None, max_nodes: int | None = None) -> go.Figure:
    """The cycle's draft tree, depth left to right, with the accepted path and the new bonus token.

    Node traces (``trace.meta == "nodes"``, one per outcome, always present and always in the same
    order) carry ``customdata`` = flattened node index (the bonus gets index ``n``). With
    ``max_nodes`` the ``max_nodes`` best-scoring drafted nodes (plus the accepted path) are shown.
    """
    cycle = one_cycle(cycle, "tree_figure")
    n = int(cycle.tokens.shape[0])
    parents = cycle.parents.tolist()
    acc_nodes = cycle.accepted_nodes.tolist()
    keep = _shown_nodes(n, acc_nodes, max_nodes)
    pos = {node: j for j, node in enumerate(keep)}
    # Layout over kept nodes + the bonus as an extra (last) child of the last accepted node.
    lay_parents = [pos[parents[i]] if parents[i] >= 0 else -1 for i in keep] + [pos[acc_nodes[-1]]]
    order = [float(i) for i in keep] + [float(n)]
    x, y = tree_layout(lay_parents, order)
    label = _labeller(tokenizer)
    tag = _labeller(tokenizer, short=True)  # beside the markers: short; the hover keeps ``label``
    data = _edge_traces(keep, parents, pos, acc_nodes, x, y)
    data += _node_traces(cycle, keep, x, y, label, tag)
    data.append(_bonus_trace(cycle, n, x[len(keep)], y[len(keep)], label, tag))
    fig = go.Figure(data=data)
    _tree_layout(fig, cycle, x, y, len(keep) - 1, max_nodes)
    return fig


def _shown_nodes(n: int, acc_nodes: list[int], max_nodes: int | None) -> list[int]:
    """Which nodes to show: all, or the best ``max_nodes`` (flattened order = score order, prefix-closed)
    plus the accepted path (ancestor-closed), so the shown set is still a tree."""
    if max_nodes is not None and n - 1 > max_nodes:
        return sorted(set(range(max_nodes + 1)) | set(acc_nodes))
    return list(range(n))


def _edge_traces(keep: list[int], parents: list[int], pos: dict, acc_nodes: list[int], x, y) -> list:
    """Edges of the whole (shown) tree, thin, and the accepted path to the bonus (layout index ``len(keep)``)."""
    ex: list = []
    ey: list = []
    for j, i in enumerate(keep):
        if parents[i] >= 0:
            pj = pos[parents[i]]
            ex += [x[pj], x[j], None]
            ey += [y[pj], y[j], None]
    data = [go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#cfcfcf", width=1), hoverinfo="skip",
                       name="tree edges", showlegend=False, meta="edges")]
    path = [pos[i] for i in acc_nodes] + [len(keep)]
    data.append(go.Scatter(x=[x[j] for j in path], y=[y[j] for j in path], mode="lines",
                           line=dict(color=OUTCOME_COLORS["accepted"], width=5), opacity=0.45, hoverinfo="skip",
                           name="accepted path", showlegend=False, meta="path"))
    return data


def _node_traces(cycle: Cycle, keep: list[int], x, y, label, tag) -> list:
    """One marker trace per outcome (rejected, agreed, accepted: always all three, in that order)."""
    parents = cycle.parents.tolist()
    tokens = cycle.tokens.tolist()
    depth = cycle.depth.tolist()
    rank = cycle.rank.tolist()
    score = cycle.score.tolist()
    dprob = cycle.draft_prob().tolist()
    tprob = cycle.target_prob.tolist()
    choice = cycle.target_choice.tolist()
    outcome = node_outcomes(cycle)
    groups: dict[str, list[int]] = {k: [] for k in OUTCOME_COLORS}
    for j, i in enumerate(keep):
        groups[outcome[i]].append(j)
    data = []
    for key in ("rejected", "agreed", "accepted"):
        js = groups[key]
        nodes = [keep[j] for j in js]
        hover = [
            f"<b>{label(tokens[i])}</b><br>node {i}, token id {tokens[i]}<br>depth {depth[i]}, rank {rank[i]}"
            f"<br>path score {score[i]:.3f}<br>draft prob {dprob[i]:.3f}"
            + (f"<br>target prob of its choice at the parent {tprob[parents[i]]:.3f}"
               f" (chose {label(choice[parents[i]])})" if parents[i] >= 0 else "<br>root: the previous bonus")
            for i in nodes
        ]
        sizes = [8 + 14 * float(np.sqrt(max(dprob[i], 0.0))) for i in nodes]
        data.append(go.Scatter(
            x=[x[j] for j in js], y=[y[j] for j in js], mode="markers+text",
            text=[tag(tokens[i]) for i in nodes], textposition="middle right", textfont=dict(size=11),
            customdata=nodes, hovertext=hover, hoverinfo="text",
            marker=dict(size=sizes, color=OUTCOME_COLORS[key], line=dict(width=1, color="white"),
                        opacity=[0.45 + 0.55 * float(min(max(dprob[i], 0.0), 1.0)) for i in nodes]),
            name=OUTCOME_NAMES[key], meta=NODE_META,
        ))
    return data


def _bonus_trace(cycle: Cycle, n: int, xb, yb, label, tag) -> go.Scatter:
    """The new bonus token, a star after the last accepted node (its customdata is ``n``)."""
    bonus = int(cycle.bonus)
    pb = cycle.accepted_nodes.tolist()[-1]
    tprob = cycle.target_prob.tolist()
    return go.Scatter(
        x=[xb], y=[yb], mode="markers+text", text=[tag(bonus)], textposition="middle right",
        textfont=dict(size=11, color=OUTCOME_COLORS["bonus"]), customdata=[n],
        hovertext=[f"<b>{label(bonus)}</b><br>bonus token id {bonus} (the target's choice after node {pb})"
                   f"<br>target prob {tprob[pb]:.3f}<br>root of the next cycle"],
        hoverinfo="text", marker=dict(size=16, symbol="star", color=OUTCOME_COLORS["bonus"],
                                      line=dict(width=1, color="black")),
        name=OUTCOME_NAMES["bonus"], meta=NODE_META,
    )


def _tree_layout(fig: go.Figure, cycle: Cycle, x, y, shown: int, max_nodes: int | None) -> None:
    """The tree figure's title (how many nodes are shown), size, legend and axes."""
    rows = int(y.max()) + 1 if len(y) else 1
    title = (f"cycle {cycle.index} · {cycle.policy} · {cycle.n_nodes} drafted nodes · accepted {cycle.accepted}"
             f" + bonus (accept length {cycle.accept_length})")
    if shown < cycle.n_nodes:
        title += (f"<br><sup>showing {shown} of {cycle.n_nodes} nodes: the top {max_nodes} by path score"
                  " and the accepted path</sup>")
    fig.update_layout(
        title=dict(text=title, font=dict(size=14), yref="container", y=1.0, yanchor="top", pad=dict(t=10)),
        height=int(min(max(360, 22 * rows + 160), 4000)),
        margin=dict(l=20, r=20, t=110, b=40), plot_bgcolor="white",
        # The legend sits above the plot area, under the title, clear of the depth ticks below it.
        hovermode="closest", legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom"),
        xaxis=dict(title="depth", dtick=1, range=[-0.3, float(x.max()) + 1.2], showgrid=True, gridcolor="#f0f0f0",
                   zeroline=False),
        yaxis=dict(visible=False, autorange="reversed"),
        meta={"cycle": cycle.index, "n_nodes": cycle.n_nodes, "shown_nodes": shown},
    )


def tree_node_count(fig) -> int:
    """Points drawn by a tree figure's node traces (shown drafted nodes + root + bonus)."""
    return sum(len(t.x or ()) for t in fig.data if t.meta == NODE_META)


def empty_figure(message: str, height: int = 320) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(height=height, xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white",
                      annotations=[dict(text=html.escape(message), showarrow=False, x=0.5, y=0.5,
                                        xref="paper", yref="paper", font=dict(size=14))])
    return fig


# ----------------------------------------------------------------------------- draft heatmap, mask
def draft_heatmap(cycle: Cycle, tokenizer=None) -> go.Figure:
    """The drafter's top-k tokens per drafted slot with their probabilities; accepted tokens outlined."""
    cycle = one_cycle(cycle, "draft_heatmap")
    D, k = cycle.draft_topk_tokens.shape if cycle.draft_topk_tokens.ndim == 2 else (0, 0)
    if D == 0:
        return empty_figure(f"cycle {cycle.index} ({cycle.policy}): no drafted slots")
    label = _labeller(tokenizer)
    toks = cycle.draft_topk_tokens.tolist()
    probs = np.exp(cycle.draft_topk_logprobs.float().numpy())
    text = [[label(t) for t in row] for row in toks]
    hover = [[f"slot {d} (depth {d + 1}), rank {j}<br><b>{text[d][j]}</b> (id {toks[d][j]})<br>p = {probs[d, j]:.3f}"
              for j in range(k)] for d in range(D)]
    fig = go.Figure(go.Heatmap(
        z=probs, x=list(range(k)), y=[d + 1 for d in range(D)], text=text, texttemplate="%{text}",
        hovertext=hover, hoverinfo="text", colorscale="Blues", zmin=0, zmax=1,
        colorbar=dict(title="draft p"), xgap=1, ygap=1,
    ))
    acc = cycle.accepted_tokens.tolist()[1:]  # depth 1..L
    mx, my = [], []
    for d, t in enumerate(acc):
        if d < D and t in toks[d]:
            mx.append(toks[d].index(t))
            my.append(d + 1)
    fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", hoverinfo="skip", name="accepted",
                             marker=dict(symbol="square-open", size=30, color="#d62728", line=dict(width=3))))
    fig.update_layout(
        title=f"cycle {cycle.index}: drafter top-{k} per slot (accepted tokens outlined)",
        xaxis=dict(title="rank", dtick=1), yaxis=dict(title="depth", dtick=1, range=[D + 0.5, 0.5]),
        height=max(280, 34 * D + 120), plot_bgcolor="white", showlegend=False,
    )
    return fig


def mask_figure(cycle: Cycle, tokenizer=None, max_nodes: int | None = 256) -> go.Figure:
    """The tree part of the verify attention mask (row attends to column), labelled by token."""
    cycle = one_cycle(cycle, "mask_figure")
    n = int(cycle.tokens.shape[0])
    m = n if max_nodes is None else min(n, max_nodes + 1)
    label, short = _labeller(tokenizer), _labeller(tokenizer, short=True)
    vis = cycle.visibility[:m, :m].numpy().astype(np.int8)
    ids = cycle.tokens[:m].tolist()
    names = [f"{i}:{label(t)}" for i, t in enumerate(ids)]  # the hover's, whole
    fig = go.Figure(go.Heatmap(
        z=vis, x=list(range(m)), y=list(range(m)), colorscale=[[0, "#ffffff"], [1, "#1f77b4"]], zmin=0, zmax=1,
        showscale=False, xgap=1 if m <= 64 else 0, ygap=1 if m <= 64 else 0,
        customdata=[[[names[r], names[c]] for c in range(m)] for r in range(m)],
        hovertemplate="%{customdata[0]} sees %{customdata[1]}: %{z}<extra></extra>",
    ))
    ticktext = [f"{i}:{short(t)}" for i, t in enumerate(ids)] if m <= 64 else [str(i) for i in range(m)]
    ticks = dict(tickmode="array", tickvals=list(range(m)), ticktext=ticktext) if m <= 64 else {}
    title = f"cycle {cycle.index}: tree attention mask ({n} x {n}, ancestor-or-self)"
    frame = mask_frame(title, f"showing the first {m} nodes" if m < n else None, ticktext, m)
    fig.update_layout(**frame, xaxis=dict(title="key node", side="top", tickangle=-90, automargin=True, **ticks),
                      yaxis=dict(title="query node", autorange="reversed", automargin=True, **ticks))
    return fig


# The mask's frame, in px at plotly's default 12 px font: a label character (wide ones included), a title line,
# an axis title with its gap, a mask cell.
CHAR_PX, MASK_TITLE_LINE_PX, MASK_AXIS_TITLE_PX, MASK_CELL_PX = 7, 30, 26, 14
TITLE_CHAR_PX = 9  # a character of the title (plotly's 17 px title font): the figure is at least its width


def mask_frame(title: str, subtitle: str | None, ticktext: list[str], m: int) -> dict:
    """Title, margins and size of an m-node mask whose key labels stand upright above it: the title (and its
    subtitle) pinned to the figure's top and, under it, the axis title and the tallest label, one above the
    other (a label run into the title is what a top margin sized for the title alone gives)."""
    tallest = CHAR_PX * max((len(html.unescape(t)) for t in ticktext), default=1)
    pad = 10
    top = pad + MASK_TITLE_LINE_PX * (2 if subtitle else 1) + MASK_AXIS_TITLE_PX + tallest + 6
    left = MASK_AXIS_TITLE_PX + tallest + 10
    side = int(min(max(MASK_CELL_PX * m, 200), 1000))
    return dict(title=dict(text=title, yref="container", y=1, yanchor="top", pad=dict(t=pad),
                           **({"subtitle": dict(text=subtitle)} if subtitle else {})),
                margin=dict(t=top, l=left, r=30, b=20), height=side + top + 20,
                width=max(side + left + 30, 420, TITLE_CHAR_PX * len(title) + 60))


# ----------------------------------------------------------------------------- token stream
def _spans(trace: Trace) -> list[tuple[int, list[int]]]:
    """(cycle index or -1 for the prefill, committed token ids) in generation order."""
    spans: list[tuple[int, list[int]]] = []
    if trace.cycles:
        spans.append((-1, [int(trace.cycles[0].root_token)]))
    for c in trace.cycles:
        toks = c.accepted_tokens.tolist()[1:] + [int(c.bonus)]
        spans.append((c.index, toks[: c.committed]))
    return spans


def token_stream(trace: Trace, tokenizer=None, width: int = 64, rows_in_view: int = 20) -> go.Figure:
    """The generated text as a character grid; each cycle's committed span shaded (alternating hue,
    darker = longer accept length). Hover: cycle index, accept length, token. Long traces open on the
    first ``rows_in_view`` rows; pan or scroll-zoom to move through the rest."""
    spans = _spans(trace)
    if not spans:
        return empty_figure("no cycles yet", height=160)
    accept = {c.index: c.accept_length for c in trace.cycles}
    cells, n_rows = _char_grid(spans, tokenizer, width)
    z, text, hover = _stream_layers(cells, spans, accept, n_rows, width)
    zmax = max(max(accept.values()) if accept else 1, 1)
    common = dict(x=list(range(width)), y=list(range(n_rows)), hoverinfo="text", texttemplate="%{text}",
                  textfont=dict(size=11, family="monospace"), xgap=0, ygap=2, hoverongaps=False)
    styles = _stream_styles(zmax)
    fig = go.Figure([
        go.Heatmap(z=np.where(np.isnan(z[k]), None, z[k]).tolist(), text=text[k].tolist(),
                   hovertext=hover[k].tolist(), **common, **styles[k])
        for k in range(3)
    ])
    view = min(n_rows, rows_in_view)
    # The key: both hues of the alternating cycle shading and the prefill (the colour bar shows only one).
    key = (f"<span style='color:{styles[1]['colorscale'][1][1]}'>■</span> even cycles  "
           f"<span style='color:{styles[2]['colorscale'][1][1]}'>■</span> odd cycles  "
           f"<span style='color:#bdbdbd'>■</span> prefill · darker = longer accept length")
    fig.add_annotation(text=key, xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom",
                       showarrow=False, font=dict(size=11), name="key")
    fig.update_layout(
        # Short first line; the scroll hint on its own small line, so neither is cut at a narrow width.
        title=dict(text=f"{trace.policy}: {len(trace.cycles)} cycles, {trace.new_tokens} new tokens, "
                        f"tau {trace.tau:.2f}" + (f"<br><sup>rows 1-{view} of {n_rows} (drag to pan)</sup>"
                                                  if n_rows > view else ""),
                   font=dict(size=14), yref="container", y=1.0, yanchor="top", pad=dict(t=8)),
        height=int(24 * max(view, 3) + 130), margin=dict(l=20, r=20, t=90, b=20), plot_bgcolor="white", dragmode="pan",
        xaxis=dict(visible=False, range=[-0.5, width - 0.5], fixedrange=True),
        yaxis=dict(visible=False, range=[view - 0.5, -0.5]),
        meta={"cycles": len(trace.cycles), "rows": n_rows},
    )
    return fig


def _char_grid(spans, tokenizer, width: int) -> tuple[list[tuple], int]:
    """The characters laid out: (row, column, char, span index, its token made visible) each, and the row
    count. A newline is drawn as ⏎ and ends the row."""
    raw_cache: dict[int, str] = {}
    cells = []
    r = col = 0
    for si, (_, toks) in enumerate(spans):
        for t in toks:
            if t not in raw_cache:
                raw_cache[t] = token_text(tokenizer, t)
            s = raw_cache[t]
            tv = visible(s)
            for ch in s:
                if col >= width:
                    r, col = r + 1, 0
                cells.append((r, col, html.escape(ch.translate(_VISIBLE), quote=False), si, tv))
                col += 1
                if ch == "\n":
                    r, col = r + 1, 0
    return cells, r + 1


def _stream_layers(cells: list[tuple], spans, accept: dict, n_rows: int, width: int) -> tuple[list, list, list]:
    """Three layers (prefill, even cycles, odd cycles) of z, text and hover [n_rows, width]: adjacent cycles
    alternate hue; z is the accept length (darker = longer)."""
    z = [np.full((n_rows, width), np.nan) for _ in range(3)]
    text = [np.full((n_rows, width), "", dtype=object) for _ in range(3)]
    hover = [np.full((n_rows, width), "", dtype=object) for _ in range(3)]
    for rr, cc, ch, si, tv in cells:
        ci = spans[si][0]
        if ci < 0:
            k, zv, hv = 0, 1, f"prefill token <b>{tv}</b>"
        else:
            k, zv = 1 + ci % 2, accept[ci]
            hv = f"cycle {ci}, accept length {zv}<br>token <b>{tv}</b>"
        z[k][rr, cc] = zv
        text[k][rr, cc] = ch
        hover[k][rr, cc] = hv
    return z, text, hover


def _stream_styles(zmax: int) -> list[dict]:
    """The three layers' colour scales; the even cycles' carries the colour bar."""
    return [
        dict(name="prefill", colorscale=[[0, "#e0e0e0"], [1, "#e0e0e0"]], showscale=False, zmin=0, zmax=1),
        # Integer ticks, at most ~5, and a title along the bar, so that a short figure (few cycles) shows
        # neither fractional ticks nor a stacked title over them.
        dict(name="even cycles", colorscale=[[0, "#f7fbff"], [1, "#6baed6"]], showscale=True, zmin=0, zmax=zmax,
             colorbar=dict(title=dict(text="accept length", side="right"), len=1.0, thickness=12,
                           tickmode="linear", tick0=0, dtick=max(1, math.ceil(zmax / 4)))),
        dict(name="odd cycles", colorscale=[[0, "#fff5eb"], [1, "#fd8d3c"]], showscale=False, zmin=0, zmax=zmax),
    ]


# ----------------------------------------------------------------------------- comparisons across runs
def _runs(traces) -> dict[str, dict]:
    """Trace | [Trace] | {label: Trace | {"accept_lengths": [...], "stage_seconds": {...}}} -> {label: dict}."""
    def as_run(v) -> dict:
        if isinstance(v, Trace):
            return {"accept_lengths": v.accept_lengths, "stage_seconds": v.stage_seconds()}
        if isinstance(v, Mapping):
            return {"accept_lengths": list(v.get("accept_lengths", [])), "stage_seconds": dict(v.get("stage_seconds", {}))}
        raise TypeError(f"expected a Trace or a dict with 'accept_lengths' and 'stage_seconds', got {type(v).__name__}")

    if isinstance(traces, Trace):
        return {traces.policy: as_run(traces)}
    if isinstance(traces, Mapping):
        if "accept_lengths" in traces and not isinstance(traces.get("accept_lengths"), (Trace, Mapping)):
            return {"run": as_run(traces)}
        return {str(k): as_run(v) for k, v in traces.items()}
    out: dict[str, dict] = {}
    for t in traces:
        name = t.policy if isinstance(t, Trace) else str(t.get("label", "run"))
        key, i = name, 2
        while key in out:
            key, i = f"{name} #{i}", i + 1
        out[key] = as_run(t)
    return out


PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def acceptance_figure(traces) -> go.Figure:
    """Left: histogram of accept lengths (share of cycles); right: running tau over cycles. One colour per run."""
    runs = _runs(traces)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("accept length per cycle", "running tau"),
                        horizontal_spacing=0.12)
    for i, (name, run) in enumerate(runs.items()):
        a = np.asarray(run["accept_lengths"], dtype=float)
        color = PALETTE[i % len(PALETTE)]
        esc = html.escape(name)
        if len(a):
            vals, counts = np.unique(a.astype(int), return_counts=True)
            share = counts / counts.sum()
        else:
            vals, counts, share = np.array([], int), np.array([], int), np.array([])
        fig.add_trace(go.Bar(x=vals.tolist(), y=share.tolist(), name=esc, legendgroup=esc, marker_color=color,
                             customdata=counts.tolist(),
                             hovertemplate=esc + "<br>accept length %{x}: %{customdata} cycles (%{y:.1%})<extra></extra>"),
                      row=1, col=1)
        running = (np.cumsum(a) / np.arange(1, len(a) + 1)) if len(a) else a
        fig.add_trace(go.Scatter(x=list(range(len(a))), y=running.tolist(), mode="lines", name=esc, legendgroup=esc,
                                 showlegend=False, line=dict(color=color),
                                 hovertemplate=esc + "<br>after cycle %{x}: tau %{y:.3f}<extra></extra>"),
                      row=1, col=2)
    fig.update_layout(barmode="group", height=380, title="acceptance", plot_bgcolor="white",
                      margin=dict(l=40, r=20, t=70, b=40))
    fig.update_xaxes(title_text="accepted + bonus", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="share of cycles", tickformat=".0%", row=1, col=1)
    fig.update_xaxes(title_text="cycle", row=1, col=2)
    fig.update_yaxes(title_text="tau (tokens / cycle)", row=1, col=2)
    return fig


def stage_times_figure(traces, per: str = "total") -> go.Figure:
    """Stacked time per stage per run, in ms: ``per="total"`` (whole run), "cycle" or "token" (per
    accepted-plus-bonus token)."""
    if per not in ("total", "cycle", "token"):
        raise ValueError(f"per={per!r}; use 'total', 'cycle' or 'token'")
    runs = _runs(traces)
    names = list(runs)
    stages = list(STAGES) + sorted({s for r in runs.values() for s in r["stage_seconds"]} - set(STAGES))
    data = []
    for s in stages:
        ys = []
        for name in names:
            run = runs[name]
            v = 1e3 * float(run["stage_seconds"].get(s, 0.0))
            div = {"total": 1, "cycle": len(run["accept_lengths"]), "token": sum(run["accept_lengths"])}[per]
            ys.append(v / div if div else 0.0)
        data.append(go.Bar(x=[html.escape(n) for n in names], y=ys, name=s, marker_color=STAGE_COLORS.get(s),
                           hovertemplate=f"{s}: %{{y:.2f}} ms<extra>%{{x}}</extra>"))
    fig = go.Figure(data)
    unit = {"total": "ms (whole run)", "cycle": "ms per cycle", "token": "ms per token"}[per]
    fig.update_layout(barmode="stack", title=f"time per stage, {unit}", yaxis_title=unit, height=380,
                      plot_bgcolor="white", margin=dict(l=50, r=20, t=60, b=40))
    return fig


def budget_sweep_figure(summary: Mapping[str, Mapping]) -> go.Figure:
    """A bench summary ({label: {tau, speedup_vs_ar, ceiling_speedup, ...}}) against the DDTree budget.

    Left: tau per budget (DFlash as a dashed reference); right: the measured decode speedup over AR
    (cycles only) beside its ceiling, the speedup if only the model forwards cost time; measured /
    ceiling is the share of the cycle spent in the forwards (<= 1; see workbench.bench.policy_bench).
    """
    import re

    pts = sorted((int(m.group(1)), s) for label, s in summary.items()
                 if (m := re.fullmatch(r"DDTree\((\d+)\)", label)))
    if not pts:
        return empty_figure("no DDTree(N) rows in this summary")
    budgets = [b for b, _ in pts]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tau (tokens per cycle)", "speedup over AR"),
                        horizontal_spacing=0.12)
    fig.add_trace(go.Scatter(x=budgets, y=[s["tau"] for _, s in pts], mode="lines+markers", name="DDTree tau",
                             line=dict(color=PALETTE[0])), row=1, col=1)
    for name, key, color in (("measured (cycles)", "decode_speedup_vs_ar", PALETTE[1]),
                             ("ceiling (forwards only)", "ceiling_speedup", PALETTE[2])):
        fig.add_trace(go.Scatter(x=budgets, y=[s.get(key) for _, s in pts], mode="lines+markers", name=name,
                                 line=dict(color=color, dash="dot" if key == "ceiling_speedup" else None)),
                      row=1, col=2)
    dflash = summary.get("DFlash")
    if dflash:
        fig.add_hline(y=dflash["tau"], line_dash="dash", line_color="#7f7f7f", annotation_text="DFlash",
                      row=1, col=1)
        if dflash.get("decode_speedup_vs_ar"):
            fig.add_hline(y=dflash["decode_speedup_vs_ar"], line_dash="dash", line_color="#7f7f7f",
                          annotation_text="DFlash", row=1, col=2)
    fig.update_xaxes(type="log", title_text="budget (nodes)")
    fig.update_layout(height=380, plot_bgcolor="white", title="DDTree budget sweep",
                      margin=dict(l=40, r=20, t=70, b=40))
    return fig
