"""Forward-mode shapes: what every forward sees and returns, named the way SGLang names it.

    import workbench as wb
    s = engine.session("def f(x):", policy=wb.DDTree(32))
    with wb.shapes.capture(s):
        s.step()                                        # per-module shapes of this cycle
    wb.shapes.table(s, mode="TARGET_VERIFY", model="target")
    wb.shapes.compare({"AR": t_ar, "DFlash": t_df, "DDTree(32)": t_dd})   # rows aligned by module
    wb.shapes.check_contracts(s.trace)                  # pass/fail rows with the numbers
    p = wb.shapes.plan("workbench/configs/qwen3-8b.json", batch=8, prompt_len=512, budget=64,
                       draft_config="workbench/configs/qwen3-8b-dflash-b16.json")   # meta device, no weights
    p.compare()

Tables are lists of plain dict rows with a text ``__str__`` and an HTML ``_repr_html_``.
"""
from __future__ import annotations

import ast
import html
import json
import re
import statistics
import time
import timeit
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workbench.capture import ShapeCapture, capture, hooks_installed
from workbench.forward import ForwardMode, ForwardRecord

__all__ = ["CheckTable", "ShapeCapture", "ShapePlan", "ShapeTable", "bench", "capture", "check_contracts",
           "compare", "hooks_installed", "plan", "sglang_forward_modes", "table"]

CONFIGS = Path(__file__).parent / "configs"


# --------------------------------------------------------------------------------------------- formatting
def fmt_bytes(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _nbytes(shape, dtype: str) -> int:
    numel = 1
    for d in shape:
        numel *= int(d)
    return numel * torch.empty(0, dtype=getattr(torch, dtype)).element_size()


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


class _Rows(list):
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
            return _fmt_shape(v)
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


class ShapeTable(_Rows):
    """Rows {forward, module, layers, io, tensor, shape, dtype, bytes}; bytes is per tensor."""

    columns = ("forward", "module", "layers", "io", "tensor", "shape", "dtype", "bytes")
    blank_repeats = ("forward",)


class CompareTable(_Rows):
    """Rows {module, layers, io, tensor, <label>: {shape, dtype, bytes} or None} aligned by module name."""

    def __init__(self, rows, labels, title=""):
        super().__init__(rows)
        self.labels = tuple(labels)
        self.columns = ("module", "layers", "io", "tensor") + self.labels
        self.title = title

    def _cell(self, row, col):
        if col in self.labels:
            v = row.get(col)
            return "-" if v is None else f"{_fmt_shape(v['shape'])} {v['dtype']} ({fmt_bytes(v['bytes'])})"
        return super()._cell(row, col)


class CheckTable(_Rows):
    """Contract checks: rows {check, result (PASS/FAIL), cycles, expected, got}."""

    columns = ("check", "result", "cycles", "expected", "got")

    def _row_style(self, row: dict) -> str:
        return "" if row.get("ok", True) else " style='background:#fdd'"

    @property
    def passed(self) -> bool:
        return all(r["ok"] for r in self)

    def failures(self) -> list[dict]:
        return [r for r in self if not r["ok"]]


# --------------------------------------------------------------------------------------------- selecting forwards
@dataclass
class ShapePlan:
    """Shapes per forward mode computed on the meta device from configs alone (see ``plan``)."""

    settings: dict
    forwards: list = field(default_factory=list)  # (label, ForwardRecord)
    notes: list = field(default_factory=list)

    def table(self, mode=None, model=None, layers=None, collapse=True) -> ShapeTable:
        return table(self, mode=mode, model=model, layers=layers, collapse=collapse)

    def compare(self, model="target", mode=None) -> CompareTable:
        """The planned forwards of ``model`` side by side (prefill, decode, DFlash verify, DDTree verify)."""
        recs = {lbl: r for lbl, r in self.forwards if r.model == model and (mode is None or r.mode == _mode(mode))}
        if not recs:
            raise ValueError(f"no planned {model} forward{'' if mode is None else ' in mode ' + str(mode)}")
        return compare(recs, mode=mode, model=model)

    def __repr__(self) -> str:
        s = self.settings
        head = (f"ShapePlan({s['model']}, batch={s['batch']}, prompt_len={s['prompt_len']}, budget={s['budget']}, "
                f"block_size={s['block_size']}, dtype={s['dtype']})")
        rows = [f"  {lbl:<34} {r.model:<6} {r.mode.value:<13} kv {r.kv_before}->{r.kv_after}" for lbl, r in self.forwards]
        return "\n".join([head] + rows + [f"  note: {n}" for n in self.notes])

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(repr(self))}</pre>" + self.compare()._repr_html_()


def _mode(mode) -> ForwardMode:
    if isinstance(mode, ForwardMode):
        return mode
    try:
        return ForwardMode(str(mode).upper())
    except ValueError:
        raise ValueError(f"mode={mode!r} is not one of {', '.join(m.value for m in ForwardMode)}") from None


def _trace_of(obj):
    return obj.trace if hasattr(obj, "trace") and hasattr(obj, "step") else obj


def _all_forwards(obj) -> list[tuple[str, ForwardRecord]]:
    """(label, record) for every forward of a Trace / Session / ShapePlan / ForwardRecord, in run order."""
    obj = _trace_of(obj)
    if isinstance(obj, ForwardRecord):
        return [(f"{obj.model} {obj.mode.value}", obj)]
    if isinstance(obj, ShapePlan):
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
    m = _mode(mode) if mode is not None else None
    if model is not None and model not in ("target", "draft"):
        raise ValueError(f"model={model!r} must be 'target' or 'draft'")
    hits = [(lbl, r) for lbl, r in fw if (m is None or r.mode == m) and (model is None or r.model == model)]
    if not hits:
        what = " ".join(x for x in (model, m.value if m else None) if x) or "any"
        raise ValueError(f"no {what} forward ran; modes that ran: {_ran(fw)}")
    if isinstance(_trace_of(obj), ShapePlan):
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
                         "shape": list(t["shape"]), "dtype": t["dtype"], "bytes": _nbytes(t["shape"], t["dtype"])})

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
        return rows
    # Every layer has the same shapes: one row per (module pattern, tensor, shape), with the layer count.
    merged: dict = {}
    for r in rows:
        layer = r.pop("layer")
        key_mod = _LAYER.sub(lambda g: f"{g.group(1)}layers.*.", r["module"]) if layer is not None else r["module"]
        key = (key_mod, r["io"], r["tensor"], tuple(r["shape"]), r["dtype"])
        if key not in merged:
            merged[key] = dict(r, module=key_mod, _layers=[])
        if layer is not None:
            merged[key]["_layers"].append(layer)
    out = []
    for r in merged.values():
        ls = r.pop("_layers")
        r["layers"] = "" if not ls else (f"{min(ls)}-{max(ls)} (x{len(ls)})" if len(ls) > 1 else str(ls[0]))
        out.append(r)
    return out


def _kv_rows(fwd: str, rec: ForwardRecord) -> list[dict]:
    """The KV cache after this forward, sized from the captured k_proj outputs (needs a capture)."""
    k = [m for m in rec.modules if m["name"].endswith("k_proj") and not m["name"].startswith("target.")]
    bs = (rec.inputs.get("input_ids") or {}).get("shape", [None])[0]
    if not k or bs is None:
        return []
    out = k[0]["outputs"]["output"]  # [bs, n, kv_heads * head_dim]
    shape = [len(k), 2, bs, rec.kv_after, out["shape"][-1]]  # layers, keys+values, bs, length, kv dim
    return [{"forward": fwd, "module": "(kv cache)", "layer": None, "io": "state", "tensor": "keys+values after",
             "shape": shape, "dtype": out["dtype"], "bytes": _nbytes(shape, out["dtype"])}]


def table(trace_or_session, mode=None, model=None, layers=None, collapse=True) -> ShapeTable:
    """Shapes of the forwards of a Trace / Session / ShapePlan, filtered by ``mode`` and ``model``.

    From a trace, the first forward of each (model, mode) is shown (a captured one if any), with
    per-module rows when a capture was on. ``layers`` keeps only those layer indices;
    ``collapse`` merges layers with identical shapes into one row. Raises ValueError naming the
    modes that did run when ``mode`` never ran.
    """
    picked = _pick(trace_or_session, mode, model)
    rows = ShapeTable(r for lbl, rec in picked for r in _record_rows(lbl, rec, layers, collapse))
    rows.title = "; ".join(f"{lbl}: {r.model} {r.mode.value}, kv cache {r.kv_before} -> {r.kv_after}"
                           for lbl, r in picked)
    if not any(r.modules for _, r in picked):
        rows.title += " (forward-level only: run under wb.shapes.capture for per-module rows)"
    return rows


def compare(runs: dict, mode=None, model: str = "target", layers=None) -> CompareTable:
    """Side by side, rows aligned by module name: ``{"AR": trace, "DFlash": trace2, "DDTree(32)": trace3}``.

    For each entry the first forward of ``model`` in ``mode`` (captured if any) is used; with
    ``mode=None``, the first non-prefill forward (AR: DECODE, DFlash/DDTree: TARGET_VERIFY).
    Values may also be ForwardRecords or ShapePlans.
    """
    if not isinstance(runs, dict) or not runs:
        raise ValueError("compare() takes a non-empty dict {label: trace or session}")
    recs = {}
    for label, obj in runs.items():
        if isinstance(obj, ForwardRecord):
            recs[label] = obj
            continue
        try:
            hits = _pick(obj, mode, model)
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
        if mode is None:
            later = [h for h in hits if h[0] != "prefill"]
            hits = later or hits
        recs[label] = hits[0][1]
    keyed: dict = {}
    order: list = []
    for label, rec in recs.items():
        prev = None
        for r in _record_rows(label, rec, layers, collapse=True):
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


# --------------------------------------------------------------------------------------------- contracts
def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """bool [n, n]: out[i, j] is True when node j is node i or one of its ancestors."""
    n = int(parents.shape[0])
    out = torch.zeros(n, n, dtype=torch.bool)
    par = parents.tolist()
    for i in range(n):
        j, steps = i, 0
        while j >= 0 and steps <= n:  # steps bound: a malformed parent cycle cannot loop forever
            out[i, j] = True
            j, steps = par[j], steps + 1
    return out


def _target_record(c) -> ForwardRecord | None:
    return next((r for r in c.forwards if r.model == "target"), None)


def check_contracts(trace_or_session, per_cycle: bool = False) -> CheckTable:
    """Contract checks over every cycle, as PASS/FAIL rows with the numbers (first failure, else first cycle).

    - logits rows: bs x tokens-per-request (not bs) in TARGET_VERIFY;
    - hidden states (the drafter's context) for every verified token;
    - positions = start + depth, so siblings share a position;
    - tree mask [bs, 1, n, prefix + n] with exactly the ancestor-or-self pattern;
    - KV length after commit = prefix + accepted + 1 (the root), read from the next cycle's
      verify ``kv_before`` (or the live cache, for a session's last cycle).
    """
    obj = trace_or_session
    trace = _trace_of(obj)
    cycles = list(trace.cycles)
    if not cycles:
        raise ValueError("the trace has no cycles to check; step() the session first")
    live_kv = None
    if trace is not obj and hasattr(obj, "kv_cache"):
        layers = obj.kv_cache()
        live_kv = int(layers[0][0].shape[-2]) if layers else None
    results: dict[str, list] = {k: [] for k in ("logits rows = bs x tokens/request", "hidden states for all tokens",
                                                "positions = start + depth", "tree mask = ancestors",
                                                "kv after commit = prefix + accepted + 1")}
    for i, c in enumerate(cycles):
        rec = _target_record(c)
        n = int(c.tokens.shape[0])
        if rec is None:
            for k in results:
                results[k].append((c.index, False, "a target forward", "none recorded"))
            continue
        bs = rec.inputs["input_ids"]["shape"][0]
        lg = rec.outputs.get("logits", {}).get("shape")
        got = lg[0] * lg[1] if lg and len(lg) == 3 else None
        results["logits rows = bs x tokens/request"].append(
            (c.index, got == bs * n, f"{bs} x {n} = {bs * n} rows ({rec.mode.value})",
             f"logits {_fmt_shape(lg) if lg else 'missing'} = {got} rows"))
        ctx = rec.outputs.get("draft_context", {}).get("shape")
        hs = rec.outputs.get("hidden_states", {}).get("shape")
        ok = ctx is not None and ctx[:2] == [bs, n] and (hs is None or hs[1:3] == [bs, n])
        results["hidden states for all tokens"].append(
            (c.index, ok, f"[{bs}, {n}, F] context for {n} tokens",
             f"context {_fmt_shape(ctx) if ctx else 'not captured'}, hidden {_fmt_shape(hs) if hs else '-'}"))
        want = c.start + c.depth
        bad = int((c.position_ids != want).sum())
        sib = sum(1 for p in set(c.parents.tolist()) if p >= 0 and int((c.parents == p).sum()) > 1)
        pos_shape = rec.inputs["positions"]["shape"]
        results["positions = start + depth"].append(
            (c.index, bad == 0 and pos_shape == [bs, n],
             f"{c.start} + depth for {n} nodes ({sib} sibling groups share a position)",
             f"{bad} of {n} differ; positions {_fmt_shape(pos_shape)}"))
        if n > 1:
            mask = rec.inputs.get("attention_mask", {}).get("shape")
            exp_shape = [bs, 1, n, c.start + n]
            wrong = int((c.visibility != ancestor_matrix(c.parents)).sum()) if c.visibility.shape == (n, n) else n * n
            results["tree mask = ancestors"].append(
                (c.index, mask == exp_shape and rec.kv_before == c.start and wrong == 0,
                 f"{_fmt_shape(exp_shape)}, ancestor pattern",
                 f"{_fmt_shape(mask) if mask else 'no mask'}, {wrong} entries off the ancestor pattern"))
        nxt = _target_record(cycles[i + 1]) if i + 1 < len(cycles) else None
        kv_after = nxt.kv_before if nxt is not None else live_kv
        if kv_after is not None:
            exp = c.start + c.accepted + 1
            results["kv after commit = prefix + accepted + 1"].append(
                (c.index, kv_after == exp, f"{c.start} + {c.accepted} + 1 = {exp}",
                 f"{kv_after} (verify grew it {rec.kv_before} -> {rec.kv_after})"))
    rows = CheckTable()
    for name, res in results.items():
        if per_cycle:
            rows += [{"check": name, "ok": ok, "result": "PASS" if ok else "FAIL", "cycles": str(ci),
                      "expected": e, "got": g} for ci, ok, e, g in res]
            continue
        if not res:
            rows.append({"check": name, "ok": True, "result": "n/a", "cycles": "0 applicable",
                         "expected": "", "got": ""})
            continue
        fails = [r for r in res if not r[1]]
        ci, ok, e, g = (fails or res)[0]
        where = f"{len(res) - len(fails)}/{len(res)} pass" + (f"; first failure: cycle {ci}" if fails else "")
        rows.append({"check": name, "ok": not fails, "result": "FAIL" if fails else "PASS", "cycles": where,
                     "expected": e, "got": g})
    rows.title = f"contracts of {trace.policy} over {len(cycles)} cycles"
    return rows


# --------------------------------------------------------------------------------------------- shapes without weights
TARGET_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings")
DRAFT_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim")


def _read_config(cfg, what: str) -> dict:
    if isinstance(cfg, dict):
        return dict(cfg)
    p = Path(cfg)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"{what} config {cfg!s} is not a file or a directory with config.json")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} config {p} is not valid JSON ({e})") from None


def _require(cfg: dict, fields, what: str) -> None:
    for f in fields:
        if cfg.get(f) is None:
            raise ValueError(f"{what} config lacks the field {f!r}, needed to compute shapes")


def _draft_get(cfg: dict, name: str):
    return (cfg.get("dflash_config") or {}).get(name, cfg.get(name))


def plan(config, batch: int = 8, prompt_len: int = 512, budget: int = 64, draft_config=None,
         dtype="bfloat16", block_size: int | None = None) -> ShapePlan:
    """Shapes per forward mode for a model config alone, on the meta device: no weights, no compute.

    Builds Qwen3ForCausalLM (and the DFlash drafter when ``draft_config`` is given) under
    ``torch.device("meta")`` and runs the engine's own forward functions on meta tensors with a
    shape capture: EXTEND prefill [batch, prompt_len], AR DECODE [batch, 1], TARGET_VERIFY for
    DFlash (block_size tokens) and DDTree (1 + budget tokens) after the prompt, and the drafter's
    block forward on its first cycle (context = the whole prompt). Bytes are per tensor.
    """
    from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

    from workbench.forward import run_draft, run_target
    from workbench.loading import resolve_dtype

    for name, v in (("batch", batch), ("prompt_len", prompt_len), ("budget", budget)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")
    tdt = resolve_dtype(dtype)
    tcfg = _read_config(config, "target")
    _require(tcfg, TARGET_FIELDS, "target")
    if tcfg.get("model_type", "qwen3") != "qwen3":
        raise ValueError(f"target config model_type={tcfg['model_type']!r}; plan() builds Qwen3 models only")
    dcfg = _read_config(draft_config, "draft") if draft_config is not None else None
    layer_ids = None
    if dcfg is not None:
        _require(dcfg, DRAFT_FIELDS, "draft")
        if _draft_get(dcfg, "block_size") is None:
            raise ValueError("draft config lacks the field 'block_size' (top level or in dflash_config)")
        layer_ids = _draft_get(dcfg, "target_layer_ids")
        if layer_ids is None:
            raise ValueError("draft config lacks the field 'target_layer_ids' (top level or in dflash_config)")
        if dcfg["hidden_size"] != tcfg["hidden_size"]:
            raise ValueError(f"draft hidden_size {dcfg['hidden_size']} != target hidden_size {tcfg['hidden_size']}; "
                             "the drafter shares the target's embedding and LM head")
        bad = [i for i in layer_ids if not 0 <= i < tcfg["num_hidden_layers"]]
        if bad:
            raise ValueError(f"draft target_layer_ids {bad} are outside the target's {tcfg['num_hidden_layers']} layers")
        block_size = block_size or int(_draft_get(dcfg, "block_size"))
    block_size = block_size or 16
    n_tree = 1 + budget
    need = prompt_len + max(n_tree, block_size)
    if need > tcfg["max_position_embeddings"]:
        raise ValueError(f"prompt_len + verify tokens = {need} exceeds max_position_embeddings "
                         f"{tcfg['max_position_embeddings']}")

    meta = torch.device("meta")
    keep = {k: v for k, v in tcfg.items() if not k.startswith("_")}
    tconf = Qwen3Config(**keep)
    with meta:
        target = Qwen3ForCausalLM(tconf).to(tdt).eval()
    models = {"target": target}
    if dcfg is not None:
        from dflash.model import DFlashDraftModel

        dkeep = {k: v for k, v in dcfg.items() if not k.startswith("_")}
        dconf = Qwen3Config(**dkeep)
        for k in ("dflash_config", "num_target_layers", "block_size"):
            if k in dcfg:
                setattr(dconf, k, dcfg[k])
        with meta:
            draft = DFlashDraftModel(dconf).to(tdt).eval()
        models["draft"] = draft
    cap = ShapeCapture(models)
    P, bs = prompt_len, batch
    ids = lambda n: torch.zeros(bs, n, dtype=torch.long, device=meta)  # noqa: E731  (meta: no data)
    pos = lambda a, n: torch.arange(a, a + n, device=meta)[None].expand(bs, n)  # noqa: E731
    forwards = []
    with torch.inference_mode():
        cache = DynamicCache(config=tconf)
        out = run_target(target, ids(P), pos(0, P), cache, ForwardMode.EXTEND, layer_ids, capture=cap)
        forwards.append(("prefill", out.record))
        context = out.features  # [bs, P, len(layer_ids) * H]: the drafter's first-cycle context

        def verify(label, n, mode):
            if cache.get_seq_length() > P:  # every scenario starts from the same prompt-only cache
                cache.crop(P - cache.get_seq_length())
            mask = torch.ones(bs, 1, n, P + n, dtype=torch.bool, device=meta) if n > 1 else None
            forwards.append((label, run_target(target, ids(n), pos(P, n), cache, mode, layer_ids, mask, cap).record))

        verify("AR decode", 1, ForwardMode.DECODE)
        verify(f"DFlash verify ({block_size} tokens)", block_size, ForwardMode.TARGET_VERIFY)
        verify(f"DDTree({budget}) verify ({n_tree} tokens)", n_tree, ForwardMode.TARGET_VERIFY)
        if dcfg is not None:
            dcache = DynamicCache(config=dconf)
            _, rec = run_draft(draft, target, ids(block_size), pos(0, P + block_size), context, dcache, cap)
            forwards.append((f"draft block (1st cycle, context {P})", rec))
    name = Path(config).stem if not isinstance(config, dict) else (tcfg.get("architectures") or ["Qwen3"])[0]
    settings = {"model": name, "batch": bs,
                "prompt_len": P, "budget": budget, "block_size": block_size, "dtype": str(tdt).replace("torch.", ""),
                "target_layer_ids": layer_ids}
    notes = ["meta device: shapes and dtypes only; bytes = numel x element size per tensor",
             "verify forwards use this engine's explicit bool mask [bs, 1, n, prefix + n]"]
    if dcfg is None:
        notes.append(f"no draft config: no drafter forward, no drafter context; block_size={block_size} assumed")
    return ShapePlan(settings, forwards, notes)


# --------------------------------------------------------------------------------------------- sglang names
def sglang_forward_modes(try_import: bool = False) -> tuple[list[str], str]:
    """Member names of sglang's ForwardMode and how they were read ("import" or "source (ast)").

    Importing ``sglang.srt.model_executor.forward_batch_info`` pulls in much of sglang (and
    fails without torchvision on a --no-deps install), so by default the class body is read
    from the installed file with ``ast``. Raises ImportError when sglang is not installed.
    """
    import importlib.util
    import sys

    mod = sys.modules.get("sglang.srt.model_executor.forward_batch_info")
    if mod is None and try_import:
        try:
            import importlib

            mod = importlib.import_module("sglang.srt.model_executor.forward_batch_info")
        except Exception:  # noqa: BLE001  (any import failure: fall back to reading the source)
            mod = None
    if mod is not None:
        return list(mod.ForwardMode.__members__), "import"
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed")
    src = Path(list(spec.submodule_search_locations)[0]) / "srt" / "model_executor" / "forward_batch_info.py"
    tree = ast.parse(src.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ForwardMode":
            names = [t.id for st in node.body if isinstance(st, ast.Assign) for t in st.targets
                     if isinstance(t, ast.Name)]
            return names, "source (ast)"
    raise ImportError(f"no class ForwardMode in {src}")


# --------------------------------------------------------------------------------------------- benchmark
def bench(engine=None, policy=None, prompt: str = "def parse(line):", cycles: int = 24, repeats: int = 3) -> dict:
    """Capture-off overhead: median DDTree(64) cycle time with capture=None and with a capture on,
    and the exact cost of the capture-off branch in run_target/run_draft (timed in isolation).

    capture=None runs the same code as an engine without a capture argument except for the
    ``capture.forward(...) if capture else _nullctx()`` / ``capture.take() if capture else ()``
    expressions, two per forward; ``off_overhead_pct`` is their cost per cycle over the median
    cycle time.
    """
    import workbench as wb
    from workbench.forward import _nullctx

    engine = engine or wb.load()
    policy = policy or wb.DDTree(64)

    def median_cycle(cap_on: bool) -> float:
        s = engine.session(prompt, policy=policy, max_new_tokens=10_000)
        times = []
        for _ in range(cycles):
            if s.finished:
                break
            t0 = time.perf_counter()
            if cap_on:
                with capture(s):
                    s.step()
            else:
                s.step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    median_cycle(False)  # warm-up
    off, on = [], []
    for _ in range(repeats):  # interleaved so drift in machine load hits both alike
        off.append(median_cycle(False))
        on.append(median_cycle(True))
    capture_none = None

    def off_branch():
        with (capture_none.forward("target", ForwardMode.TARGET_VERIFY) if capture_none else _nullctx()):
            pass
        return capture_none.take() if capture_none else ()

    n = 200_000
    per_forward = min(timeit.repeat(off_branch, number=n, repeat=5)) / n
    off_s, on_s = statistics.median(off), statistics.median(on)
    per_cycle = 2 * per_forward  # two forwards per drafted cycle (drafter block + target verify)
    return {"policy": str(policy), "cycle_ms_capture_none": 1e3 * off_s, "cycle_ms_capture_on": 1e3 * on_s,
            "off_branch_us_per_cycle": 1e6 * per_cycle, "off_overhead_pct": 100 * per_cycle / off_s,
            "on_overhead_pct": 100 * (on_s - off_s) / off_s,
            "hooks_after": hooks_installed(engine.models.target) + hooks_installed(engine.models.draft)}


def _main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m workbench.shapes", description=__doc__.splitlines()[0])
    ap.add_argument("--bench", action="store_true", help="capture-off overhead benchmark")
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--cycles", type=int, default=24)
    ap.add_argument("--plan", default=None, help="a target config.json: print its shape plan")
    ap.add_argument("--draft-config", default=None)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    if a.budget < 1:  # bad input: one line and exit 2, like the workbench CLI
        ap.exit(2, f"{ap.prog}: error: --budget {a.budget} must be a positive integer\n")
    if a.plan:
        p = plan(a.plan, budget=a.budget, draft_config=a.draft_config)
        print(p)
        print(p.compare())
    if a.bench:
        import workbench as wb

        eng = wb.load(target=a.target, draft=a.draft, threads=a.threads)
        for k, v in bench(eng, wb.DDTree(a.budget), cycles=a.cycles).items():
            print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    if not (a.plan or a.bench):
        ap.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
