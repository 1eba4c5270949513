"""Shape tables: rows per forward (ours), aligned side by side, with SGLang's layout beside ours.

Tables are lists of plain dict rows with a text ``__str__`` and an HTML ``_repr_html_``.
"""
from __future__ import annotations

import re
from typing import Protocol, runtime_checkable

import torch

from workbench.models.registry import nbytes
from workbench.records.forward import ForwardMode, ForwardRecord
from workbench.shapes.rows import CheckTable, CompareTable, LayoutTable, ShapeTable, fmt_bytes, fmt_shape  # noqa: F401
from workbench.shapes.sglang_layout import layout_of_record


# --------------------------------------------------------------------------------------------- formatting
def _nbytes(shape, dtype: str) -> int:
    return nbytes(shape, getattr(torch, dtype))  # a torch dtype's name ("int64", "bool", ...)


# --------------------------------------------------------------------------------------------- selecting forwards
def forward_mode(mode) -> ForwardMode:
    """A ForwardMode from itself or its name (any case); a one-line ValueError naming the known ones."""
    if isinstance(mode, ForwardMode):
        return mode
    try:
        return ForwardMode(str(mode).upper())
    except ValueError:
        raise ValueError(f"mode={mode!r} is not one of {', '.join(m.value for m in ForwardMode)}") from None


@runtime_checkable
class PlannedForwards(Protocol):
    """What the tables read from a shape plan (``shapes.plan.ShapePlan``, which builds on this module):
    its forwards, each labelled, and its settings."""

    forwards: list  # [(label, ForwardRecord)]
    settings: dict


def trace_of(obj):
    """The trace of a Session or BatchSession; anything else as it is."""
    if hasattr(obj, "verify_layout") and hasattr(obj, "sessions"):  # a BatchSession: its requests' traces
        return obj.sessions[0].trace  # share the batched forwards, so any one of them shows them
    return obj.trace if hasattr(obj, "trace") and hasattr(obj, "step") else obj


def _ragged_lens(obj, rec) -> tuple[list[int], list[int]] | None:
    """For a BatchSession's batched forward: (prefix lengths, verified tokens) per request, the ragged
    rows SGLang would flatten; None for anything else (every row is then n tokens)."""
    for bc in getattr(obj, "cycles", ()) if hasattr(obj, "verify_layout") else ():
        if any(r is rec for r in bc.forwards):
            return [c.start for c in bc.cycles], list(bc.verify_lens)
    return None


def _all_forwards(obj) -> list[tuple[str, ForwardRecord]]:
    """(label, record) for every forward of a Trace / Session / ShapePlan / ForwardRecord, in run order."""
    obj = trace_of(obj)
    if isinstance(obj, ForwardRecord):
        return [(f"{obj.model} {obj.mode.value}", obj)]
    if isinstance(obj, PlannedForwards):
        return list(obj.forwards)
    if hasattr(obj, "cycles"):
        out = [("prefill", obj.prefill)] if obj.prefill is not None else []
        return out + [(f"cycle {c.index}", r) for c in obj.cycles for r in c.forwards]
    raise TypeError(f"expected a Trace, Session, ShapePlan or ForwardRecord, got {type(obj).__name__}")


def _ran(forwards) -> str:
    seen: dict[str, set] = {}
    for _, r in forwards:
        seen.setdefault(r.mode.value, set()).add(r.model)
    return "; ".join(f"{m} ({', '.join(sorted(v))})" for m, v in seen.items()) or "none"


def _pick(obj, mode=None, model=None) -> list[tuple[str, ForwardRecord]]:
    """Forwards matching mode/model. From a trace: the first of each (model, mode), preferring a captured one."""
    fw = _all_forwards(obj)
    m = forward_mode(mode) if mode is not None else None
    if model is not None and model not in ("target", "draft"):
        raise ValueError(f"model={model!r} must be 'target' or 'draft'")
    hits = [(lbl, r) for lbl, r in fw if (m is None or r.mode == m) and (model is None or r.model == model)]
    if not hits:
        what = " ".join(x for x in (model, m.value if m else None) if x) or "any"
        raise ValueError(f"no {what} forward ran; modes that ran: {_ran(fw)}")
    if isinstance(trace_of(obj), PlannedForwards):
        return hits
    first: dict = {}
    for i, (lbl, r) in enumerate(hits):
        key = (r.model, r.mode)
        if key not in first or (r.modules and not first[key][2].modules):
            first[key] = (i, lbl, r)
    return [(lbl, r) for _, lbl, r in sorted(first.values(), key=lambda x: x[0])]


# --------------------------------------------------------------------------------------------- tables
_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


def _record_rows(label: str, rec: ForwardRecord, layers=None, collapse=True) -> list[dict]:
    fwd = f"{label}: {rec.model} {rec.mode.value}"
    rows = []

    def add(module, io, tensors, layer=None):
        for name, t in tensors.items():
            rows.append({"forward": fwd, "module": module, "layer": layer, "io": io, "tensor": name,
                         "shape": list(t["shape"]), "dtype": t["dtype"], "device": t.get("device", ""),
                         "bytes": _nbytes(t["shape"], t["dtype"])})

    add("(forward)", "in", rec.inputs)
    add("(forward)", "out", rec.outputs)
    for m in rec.modules:
        lm = _LAYER.search(m["name"])
        layer = int(lm.group(2)) if lm else None
        if layers is not None and layer is not None and layer not in layers:
            continue
        add(m["name"], "in", m["inputs"], layer)
        add(m["name"], "out", m["outputs"], layer)
    rows += _kv_rows(fwd, rec)
    if not collapse:
        for r in rows:
            layer = r.pop("layer")
            r["layers"] = "" if layer is None else str(layer)
        return rows + _state_rows(fwd, rec)
    # Every layer has the same shapes: one row per (module pattern, tensor, shape), with the layer count.
    merged: dict = {}
    for r in rows:
        layer = r.pop("layer")
        key_mod = _LAYER.sub(lambda g: f"{g.group(1)}layers.*.", r["module"]) if layer is not None else r["module"]
        key = (key_mod, r["io"], r["tensor"], tuple(r["shape"]), r["dtype"], r["device"])
        if key not in merged:
            merged[key] = dict(r, module=key_mod, _layers=[])
        if layer is not None:
            merged[key]["_layers"].append(layer)
    out = []
    for r in merged.values():
        ls = r.pop("_layers")
        r["layers"] = _layer_span(ls)
        out.append(r)
    return out + _state_rows(fwd, rec)


def _layer_span(ls: list[int]) -> str:
    return "" if not ls else (f"{min(ls)}-{max(ls)} (x{len(ls)})" if len(ls) > 1 else str(ls[0]))


def _state_rows(fwd: str, rec: ForwardRecord) -> list[dict]:
    """A hybrid target's recurrent tensors in this forward (``rec.states``), one row per kind; bytes are one
    layer's, ``layers`` names the linear layers holding one each. io: "in" read, "out" written."""
    return [{"forward": fwd, "module": "(recurrent state)", "layers": _layer_span(x["layers"]), "io": x["io"],
             "tensor": x["name"], "shape": list(x["shape"]), "dtype": x["dtype"], "device": x.get("device", ""),
             "bytes": _nbytes(x["shape"], x["dtype"])} for x in getattr(rec, "states", ())]


def _kv_rows(fwd: str, rec: ForwardRecord) -> list[dict]:
    """The KV cache after this forward, sized from the captured k_proj outputs (needs a capture)."""
    k = [m for m in rec.modules if m["name"].endswith("k_proj") and not m["name"].startswith("target.")]
    bs = (rec.inputs.get("input_ids") or {}).get("shape", [None])[0]
    if not k or bs is None:
        return []
    out = k[0]["outputs"]["output"]  # [bs, n, kv_heads * head_dim]
    shape = [len(k), 2, bs, rec.kv_after, out["shape"][-1]]  # layers, keys+values, bs, length, kv dim
    dev = (rec.inputs.get("input_ids") or {}).get("device", "")
    return [{"forward": fwd, "module": "(kv cache)", "layer": None, "io": "state", "tensor": "keys+values after",
             "shape": shape, "dtype": out["dtype"], "device": dev, "bytes": _nbytes(shape, out["dtype"])}]


def _is_tree(obj, label: str) -> bool:
    """A tree verify (DDTree) needs SGLang's custom mask; a DFlash chain runs causal."""
    return "DDTree" in label or "DDTree" in str(getattr(trace_of(obj), "policy", ""))


def _prompt_logprobs(obj) -> bool:
    """A plan's settings (a dict) can ask for prompt log-probs; a trace's ``settings`` (its list of
    policy/sampling labels) never does."""
    settings = getattr(obj, "settings", None)
    return isinstance(settings, dict) and bool(settings.get("prompt_logprobs"))


def sglang_view(obj, picked, use_sglang: bool = True) -> LayoutTable:
    """SGLang's layout (sglang_layout.layout) of each picked forward, with our recorded shapes beside it."""
    rows = LayoutTable()
    titles = []
    for lbl, rec in picked:
        ragged = _ragged_lens(obj, rec) if rec.mode == ForwardMode.TARGET_VERIFY and rec.model == "target" else None
        t = layout_of_record(rec, tree=_is_tree(obj, lbl) and rec.mode == ForwardMode.TARGET_VERIFY,
                             use_sglang=use_sglang, return_logprob=_prompt_logprobs(obj), ragged=ragged)
        fwd = f"{lbl}: {rec.model} {rec.mode.value}"
        rows += [dict(r, forward=fwd) for r in t]
        titles.append(f"{lbl}: " + t.title.removeprefix("SGLang layout: "))
    rows.title = "SGLang layout; " + "; ".join(titles)
    return rows


def table(trace_or_session, mode=None, model=None, layers=None, collapse=True, view: str = "ours"):
    """Shapes of the forwards of a Trace / Session / ShapePlan, filtered by ``mode`` and ``model``.

    From a trace, the first forward of each (model, mode) is shown (a captured one if any), with
    per-module rows when a capture was on. ``layers`` keeps only those layer indices;
    ``collapse`` merges layers with identical shapes into one row. Raises ValueError naming the
    modes that did run when ``mode`` never ran. ``view="sglang"``: a LayoutTable of the tensors
    SGLang builds for the same forwards (flat tokens, indptrs, custom mask, kept logits rows),
    with ours in the ``ours`` column.
    """
    if view not in ("ours", "sglang"):
        raise ValueError(f"view={view!r} must be 'ours' or 'sglang'")
    picked = _pick(trace_or_session, mode, model)
    if view == "sglang":
        return sglang_view(trace_or_session, picked)
    rows = ShapeTable(r for lbl, rec in picked for r in _record_rows(lbl, rec, layers, collapse))
    rows.title = "; ".join(f"{lbl}: {r.model} {r.mode.value}, kv cache {r.kv_before} -> {r.kv_after}"
                           for lbl, r in picked)
    if not any(r.modules for _, r in picked):
        rows.title += " (forward-level only: run under wb.shapes.capture for per-module rows)"
    return rows


def compare(runs: dict, mode=None, model: str = "target", layers=None, sglang: bool = True) -> CompareTable:
    """Side by side, rows aligned by module name: ``{"AR": trace, "DFlash": trace2, "DDTree(32)": trace3}``.

    For each entry the first forward of ``model`` in ``mode`` (captured if any) is used; with
    ``mode=None``, the first non-prefill forward (AR: DECODE, DFlash/DDTree: TARGET_VERIFY).
    Values may also be ForwardRecords or ShapePlans. ``sglang``: add module "(sglang layout)" rows,
    the tensors SGLang builds for the same forward (see ``table(..., view="sglang")``).
    """
    if not isinstance(runs, dict) or not runs:
        raise ValueError("compare() takes a non-empty dict {label: trace or session}")
    recs, trees = {}, {}
    for label, obj in runs.items():
        if isinstance(obj, ForwardRecord):
            recs[label], trees[label] = obj, "DDTree" in label
            continue
        try:
            hits = _pick(obj, mode, model)
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
        if mode is None:
            later = [h for h in hits if h[0] != "prefill"]
            hits = later or hits
        recs[label], trees[label] = hits[0][1], _is_tree(obj, label + hits[0][0])
    keyed: dict = {}
    order: list = []
    for label, rec in recs.items():
        prev = None
        for r in _record_rows(label, rec, layers, collapse=True) + (_sglang_rows(rec, trees[label]) if sglang else []):
            # Layer ranges match across runs of one model; a different depth shows as its own row.
            key = (r["module"], r["layers"], r["io"], r["tensor"])
            if key not in keyed:  # a row only this run has goes right after its predecessor in this run
                keyed[key] = {"module": r["module"], "layers": r["layers"], "io": r["io"], "tensor": r["tensor"]}
                order.insert(order.index(prev) + 1 if prev is not None else 0, key)
            keyed[key][label] = {"shape": r["shape"], "dtype": r["dtype"], "bytes": r["bytes"]}
            prev = key
    title = "; ".join(f"{lbl}: {r.model} {r.mode.value}, kv {r.kv_before}->{r.kv_after}" for lbl, r in recs.items())
    rows = [{**{lbl: None for lbl in recs}, **keyed[k]} for k in order]  # None: this run has no such tensor
    return CompareTable(rows, recs.keys(), title)


def _sglang_rows(rec: ForwardRecord, tree: bool) -> list[dict]:
    """compare() rows for SGLang's layout of ``rec``: module "(sglang layout)", one per tensor it builds."""
    return [{"module": "(sglang layout)", "layers": "", "io": "sglang", "tensor": r["tensor"], "shape": r["shape"],
             "dtype": r["dtype"] or "-", "bytes": r["bytes"]}
            for r in layout_of_record(rec, tree=tree and rec.mode == ForwardMode.TARGET_VERIFY)]


