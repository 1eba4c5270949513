"""A one-page HTML report of one or more runs (trace files or Trace objects), self-contained."""
from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path

from workbench.cycle import Trace
from workbench.views.export import atomic_write_text, page
from workbench.views.figures import (
    acceptance_figure, draft_heatmap, stage_times_figure, token_stream, tree_figure,
)


def _load_traces(src) -> dict[str, Trace]:
    """Path | Trace | [Path | Trace] | {label: Path | Trace} -> {label: Trace} (TraceFileError on a bad file)."""
    def one(v) -> Trace:
        return v if isinstance(v, Trace) else Trace.load(v)

    if isinstance(src, (str, Path, Trace)):
        src = [src]
    if isinstance(src, Mapping):
        return {str(k): one(v) for k, v in src.items()}
    out: dict[str, Trace] = {}
    for v in src:
        t = one(v)
        name = t.policy if isinstance(v, Trace) else f"{t.policy} ({Path(v).name})"
        key, i = name, 2
        while key in out:
            key, i = f"{name} #{i}", i + 1
        out[key] = t
    return out


def tokenizer_for(trace: Trace):
    """The tokenizer saved next to the trace's target model, if that folder still exists (else None: ids)."""
    target = trace.meta.get("target")
    if not target or not Path(target, "tokenizer.json").exists():
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(target)
    except Exception:
        return None


def report_html(traces, tokenizer=None, title: str = "ddtree-workbench report", max_nodes: int = 512) -> str:
    """The report page as a string: summary table, acceptance, stage times, and per run the token stream
    and the tree of its longest-accepting cycle."""
    runs = _load_traces(traces)
    if not runs:
        raise ValueError("no traces to report on")
    parts: list = [f"<h1>{html.escape(title)}</h1>"]
    first = next(iter(runs.values()))
    prompt = first.meta.get("prompt")
    if prompt is not None:
        parts.append(f"<p>prompt: <code>{html.escape(str(prompt))}</code></p>")
    rows = []
    for name, t in runs.items():
        s = t.summary()
        rows.append(f"<tr><td style='text-align:left'>{html.escape(name)}</td><td>{s.tau:.2f}</td><td>{s.cycles}</td>"
                    f"<td>{s.new_tokens}</td><td>{s.tokens_per_s:.1f}</td><td>{1e3 * s.seconds:.1f}</td>"
                    f"<td style='text-align:left'>{html.escape(str(s.finish_reason))}</td></tr>")
    parts.append("<table><tr><th>run</th><th>tau</th><th>cycles</th><th>new tokens</th><th>tok/s</th>"
                 "<th>cycle time ms</th><th>finished</th></tr>" + "".join(rows) + "</table>")
    parts.append(acceptance_figure(runs))
    parts.append(stage_times_figure(runs))
    for name, t in runs.items():
        tok = tokenizer if tokenizer is not None else tokenizer_for(t)
        parts.append(f"<h2>{html.escape(name)}</h2>")
        if tok is None:
            parts.append("<p><i>tokenizer not found: tokens are shown as ids</i></p>")
        if not t.cycles:
            parts.append("<p>no cycles</p>")
            continue
        parts.append(token_stream(t, tok))
        best = max(t.cycles, key=lambda c: (c.accept_length, -c.index))
        parts.append(f"<p>the cycle with the longest accepted path: cycle {best.index}</p>")
        parts.append(tree_figure(best, tok, max_nodes=max_nodes))
        if best.draft_topk_tokens.shape[0]:
            parts.append(draft_heatmap(best, tok))
    return page(title, parts)


def write_report(trace_path_or_traces, out_path, tokenizer=None, title: str = "ddtree-workbench report") -> Path:
    """Write a self-contained HTML report (plotly.js inline, no network needed) to ``out_path``, atomically.

    ``trace_path_or_traces``: a trace JSONL path, a Trace, a list of either, or {label: path or Trace}.
    Token text comes from ``tokenizer``, else from the tokenizer saved with the trace's target model.
    """
    return atomic_write_text(out_path, report_html(trace_path_or_traces, tokenizer=tokenizer, title=title))
