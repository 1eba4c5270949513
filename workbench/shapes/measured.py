"""The cost model against a measured sweep (``workbench.bench.sweep``): its prediction of every point and
its error, so the model's accuracy is a number.

    from workbench.bench import sweep as sw
    err = wb.shapes.sweep_error(sw.sweep(wb.load(), nodes=(1, 4, 16), rows=(1, 4)))
    err.median_rel_error, err.max_rel_error; print(err)

A point's prediction is the roofline of the forward the sweep ran (``cost.forward_cost`` at the sweep's
rows, nodes, key columns and dtype) on the measured device: its matmul FLOP/s at the forward's token count
(``flops_at``), its streaming bandwidth, both measured apart from the sweep, plus the ops that forward
dispatches times the device's seconds per op (eager: every op is a launch or a dispatch; a CUDA graph:
one launch). Nothing is fitted to the points. ``peak=True`` predicts with the peak matmul rate instead
(the plain roofline), to show what the token-count term buys.
"""
from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass, field
from types import SimpleNamespace

from workbench.shapes.cost import arch, forward_cost, resolve_gpu


def predict_forward(a, kind: str, rows: int, nodes: int, keys: int, context_rows: int, dtype_bytes: int,
                    device, ops: int = 0) -> dict:
    """Predicted seconds of one swept forward. ``kind`` "verify": TARGET_VERIFY of ``nodes`` per row (every
    node's logits, one recurrent state per node for hybrids); "draft": the DFlash block of ``nodes`` after
    ``context_rows`` new context rows. ``keys``: the columns attention sees. ``device``: flops, bandwidth
    and (optionally) op_seconds, per op of ``ops``."""
    if kind == "verify":
        c = forward_cost(a, "TARGET_VERIFY", rows, nodes, keys - nodes, nodes, dtype_bytes, tree_states=True)
    elif kind == "draft":
        c = forward_cost(a, "DRAFT", rows, nodes, keys - nodes - context_rows, nodes - 1, dtype_bytes,
                         context=context_rows)
    else:
        raise ValueError(f"kind={kind!r}: expected 'verify' or 'draft'")
    compute, memory = c["flops"] / flops_at(device, rows * nodes), c["bytes"] / device.bandwidth
    launch = ops * getattr(device, "op_seconds", 0.0)
    return {**c, "compute_s": compute, "memory_s": memory, "launch_s": launch,
            "seconds": max(compute, memory) + launch, "bound": "compute" if compute > memory else "memory"}


def flops_at(device, tokens: int) -> float:
    """The device's matmul FLOP/s for a forward of ``tokens`` rows: its measured ``flops_at`` entry nearest in
    log scale (a skinny matmul reaches less of the peak), else its peak ``flops``."""
    table = {int(k): float(v) for k, v in (getattr(device, "flops_at", None) or {}).items()}
    if not table:
        return device.flops
    return table[min(table, key=lambda m: abs(math.log(m) - math.log(max(tokens, 1))))]


@dataclass
class SweepError:
    rows: list  # {kind, mode, rows, nodes, measured_s, predicted_s, rel_error, bound}
    settings: dict
    notes: list = field(default_factory=list)

    @staticmethod
    def _stats(rows) -> dict:
        errs = [abs(r["rel_error"]) for r in rows if not r.get("calibration")]
        return {"points": len(errs), "median_rel_error": statistics.median(errs) if errs else None,
                "max_rel_error": max(errs) if errs else None}

    @property
    def median_rel_error(self) -> float:
        return self._stats(self.rows)["median_rel_error"]

    @property
    def max_rel_error(self) -> float:
        return self._stats(self.rows)["max_rel_error"]

    def by_kind(self) -> dict:
        """{(kind, mode): {points, median_rel_error, max_rel_error}}."""
        keys = sorted({(r["kind"], r["mode"]) for r in self.rows})
        return {k: self._stats([r for r in self.rows if (r["kind"], r["mode"]) == k]) for k in keys}

    def as_dict(self) -> dict:
        return {"settings": self.settings, "rows": self.rows, "median_rel_error": self.median_rel_error,
                "max_rel_error": self.max_rel_error,
                "by_kind": {f"{k}/{m}": v for (k, m), v in self.by_kind().items()}, "notes": self.notes}

    def __repr__(self) -> str:
        s = self.settings
        n = sum(not r.get("calibration") for r in self.rows)
        lines = [f"cost model vs measured sweep ({s['model']}, {s['dtype']} on {s['device']}): median |error| "
                 f"{self.median_rel_error:.0%}, max {self.max_rel_error:.0%} over {n} points",
                 f"  {'kind':<7}{'mode':<8}{'rows':>5}{'nodes':>6}{'measured ms':>13}{'predicted ms':>14}{'error':>8}  bound"]
        for r in self.rows:
            lines.append(f"  {r['kind']:<7}{r['mode']:<8}{r['rows']:>5}{r['nodes']:>6}{r['measured_s'] * 1e3:>13.3f}"
                         f"{r['predicted_s'] * 1e3:>14.3f}{r['rel_error']:>+8.0%}  {r['bound']}"
                         + ("  (calibration point)" if r.get("calibration") else ""))
        for (k, m), v in self.by_kind().items():
            lines.append(f"  {k}/{m}: median |error| {v['median_rel_error']:.0%}, max {v['max_rel_error']:.0%}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(repr(self))}</pre>"


def sweep_error(sweep, device=None, peak: bool = False, calibrate: bool = False) -> SweepError:
    """Every measured point of ``sweep`` (a ``workbench.bench.sweep.Sweep`` or its ``as_dict()``) beside the
    cost model's prediction; rel_error = predicted / measured - 1. ``device``: a roofline to predict with
    (a GPU name, a Gpu, (flops, bandwidth)); default the sweep's own measured device.

    ``calibrate``: take each (kind, mode)'s seconds per dispatched op from its smallest point (measured minus
    roofline, over its ops: what an eager forward costs beyond its arithmetic and bytes, Python and launches
    included) instead of the device's one-op microbenchmark; that point is then marked ``calibration`` and
    left out of the error figures."""
    from workbench.models.registry import dtype_bytes

    d = sweep if isinstance(sweep, dict) else sweep.as_dict()  # a Sweep, or its JSON read back
    if device is not None:
        dev = resolve_gpu(device)
    elif d.get("device"):
        dev = SimpleNamespace(**{**d["device"], **({"flops_at": {}} if peak else {})})
    else:
        raise ValueError("the sweep carries no measured device (device_profile=False): pass device=")
    settings = d["settings"]
    e = dtype_bytes(settings["dtype"])
    target = arch(d["target_config"], "target")
    draft = arch(d["draft_config"], "draft") if d.get("draft_config") else None
    points = [p for p in d["points"] if (target if p["kind"] == "verify" else draft) is not None]

    def predict(p, per_op):
        a = target if p["kind"] == "verify" else draft
        ops = 1 if p["mode"] == "graphs" else p["ops"]  # a graph replays as one launch
        return predict_forward(a, p["kind"], p["rows"], p["nodes"], p["keys"], p["context_rows"], e,
                               SimpleNamespace(**{**vars(SimpleNamespace(**dev.__dict__)), "op_seconds": per_op})
                               if per_op is not None else dev, ops)

    per_op, anchors = {}, set()
    if calibrate:
        for key in sorted({(p["kind"], p["mode"]) for p in points}):
            same = [p for p in points if (p["kind"], p["mode"]) == key]
            p0 = min(same, key=lambda p: (p["rows"] * p["nodes"], p["rows"]))
            base = predict(p0, 0.0)["seconds"]
            ops = 1 if p0["mode"] == "graphs" else max(p0["ops"], 1)
            per_op[key] = max(p0["median_s"] - base, 0.0) / ops
            anchors.add(id(p0))
    rows = []
    for p in points:
        pred = predict(p, per_op.get((p["kind"], p["mode"])))
        rows.append({"kind": p["kind"], "mode": p["mode"], "rows": p["rows"], "nodes": p["nodes"],
                     "measured_s": p["median_s"], "predicted_s": pred["seconds"],
                     "rel_error": pred["seconds"] / p["median_s"] - 1, "bound": pred["bound"],
                     "launch_s": pred["launch_s"], "calibration": id(p) in anchors})
    name = getattr(dev, "name", str(dev))
    notes = [f"predicted on {name}: {dev.flops / 1e9:.1f} GFLOP/s peak, {dev.bandwidth / 1e9:.1f} GB/s, "
             + ("matmul rate per token count measured apart from the sweep, " if getattr(dev, "flops_at", None) else "")
             + (f"{getattr(dev, 'op_seconds', 0.0) * 1e6:.1f} us per op (microbenchmark); nothing fitted" if not calibrate
                else "seconds per op from each kind's smallest point: "
                + ", ".join(f"{k}/{m} {v * 1e6:.1f} us" for (k, m), v in per_op.items())
                + " (those points left out of the error)")]
    return SweepError(rows, dict(settings), notes)


__all__ = ["SweepError", "predict_forward", "sweep_error"]
