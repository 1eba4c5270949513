"""A one-page HTML report of one or more runs (trace files or Trace objects), self-contained."""
from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path

from workbench.records.cycle import Trace
from workbench.records.files import write_text_atomic
from workbench.views.export import page
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


def tokenizer_for(trace: Trace, target=None):
    """The tokenizer of ``target`` (a model directory), else of the trace's own target model: found
    relative to the package for the embedded pair, else at its stored path (None when missing: ids)."""
    from workbench.engine.loading import resolve_model_ref

    target = Path(target) if target else resolve_model_ref(trace.meta.get("target"))
    if target is None or not Path(target, "tokenizer.json").exists():
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(target)
    except Exception:
        return None


SETTINGS = (("temperature", "temperature"), ("top_p", "top-p"), ("top_k", "top-k"), ("seed", "seed"),
            ("device", "device"), ("dtype", "dtype"), ("kernel_backend", "kernel backend"),
            ("block_size", "draft block"), ("target", "target"), ("draft", "draft"))


def _setting(v) -> str:
    """A meta value; a list is the values a setting took, in order, when it changed mid-session."""
    return " → ".join(map(str, v)) if isinstance(v, list) else str(v)


def settings_table(runs: Mapping[str, Trace]) -> str:
    """The settings each run used (one row per run): sampling, seed, device, dtype, kernels, models."""
    keys = [(k, label) for k, label in SETTINGS if any(k in t.meta for t in runs.values())]
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in keys)
    rows = "".join(
        f"<tr><td style='text-align:left'>{html.escape(name)}</td>"
        + "".join(f"<td>{html.escape(_setting(t.meta.get(k, '-')))}</td>" for k, _ in keys) + "</tr>"
        for name, t in runs.items())
    return f"<h2>settings</h2><table><tr><th>run</th>{head}</tr>{rows}</table>"


def report_html(traces, tokenizer=None, title: str = "ddtree-workbench report", max_nodes: int = 512) -> str:
    """The report page as a string: summary and settings tables, acceptance, stage times, and per run the
    token stream and the tree of its longest-accepting cycle."""
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
                    f"<td>{s.new_tokens}</td><td>{1e3 * s.prefill_seconds:.1f}</td><td>{1e3 * s.seconds:.1f}</td>"
                    f"<td>{s.tokens_per_s:.1f}</td><td>{s.decode_tokens_per_s:.1f}</td>"
                    f"<td style='text-align:left'>{html.escape(str(s.finish_reason))}</td></tr>")
        if s.mixed:  # the policy or the sampling changed mid-session: figures per setting
            rows += [f"<tr><td style='text-align:left'>&nbsp;· {html.escape(f.setting)}</td><td>{f.tau:.2f}</td>"
                     f"<td>{f.cycles}</td><td>{f.committed}</td><td></td><td>{1e3 * f.seconds:.1f}</td><td></td>"
                     f"<td>{f.tokens_per_s:.1f}</td><td></td></tr>" for f in s.by_policy.values()]
    parts.append("<table><tr><th>run</th><th>tau</th><th>cycles</th><th>new tokens</th><th>prefill ms</th>"
                 "<th>total ms</th><th>tok/s</th><th>tok/s in cycles</th><th>finished</th></tr>" + "".join(rows)
                 + "</table><p>tok/s = new tokens / total time (prefill + cycles); tok/s in cycles = tokens the "
                 "cycles committed / their time.</p>")
    parts.append(settings_table(runs))
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
    return write_text_atomic(out_path, report_html(trace_path_or_traces, tokenizer=tokenizer, title=title))


def bench_page(rows: list[dict], source: str) -> str:
    """One self-contained HTML page: a summary table and the acceptance / stage-time figures per policy."""
    by: dict[str, dict] = {}
    for r in rows:
        d = by.setdefault(r["policy"], {"accept_lengths": [], "stage_seconds": {}, "new_tokens": 0, "wall_time": 0.0,
                                        "prompts": 0})
        d["accept_lengths"] += list(r["accept_lengths"])
        for k, v in r["stage_seconds"].items():
            d["stage_seconds"][k] = d["stage_seconds"].get(k, 0.0) + float(v)
        d["new_tokens"] += int(r.get("new_tokens", 0))
        d["wall_time"] += float(r.get("wall_time", 0.0))
        d["prompts"] += 1
    ar = by.get("AR")
    ar_tps = ar["new_tokens"] / ar["wall_time"] if ar and ar["wall_time"] else None
    trs = []
    for label, d in by.items():
        al = d["accept_lengths"]
        tau = sum(al) / len(al) if al else 0.0
        tps = d["new_tokens"] / d["wall_time"] if d["wall_time"] else 0.0
        sp = f"{tps / ar_tps:.2f}" if ar_tps else "-"
        trs.append(f"<tr><td>{html.escape(label)}</td><td>{d['prompts']}</td><td>{tau:.2f}</td><td>{tps:.1f}</td>"
                   f"<td>{sp}</td><td>{len(al)}</td></tr>")
    table = ("<table><tr><th>policy</th><th>prompts</th><th>tau</th><th>tokens/s</th><th>speedup vs AR</th>"
             f"<th>cycles</th></tr>{''.join(trs)}</table>")
    data = {k: {"accept_lengths": v["accept_lengths"], "stage_seconds": v["stage_seconds"]} for k, v in by.items()}
    return page(f"workbench bench: {source}", [
        f"<h1>Benchmark: {html.escape(source)}</h1>", table,
        acceptance_figure(data), stage_times_figure(data, per="cycle"), stage_times_figure(data, per="token"),
    ])
