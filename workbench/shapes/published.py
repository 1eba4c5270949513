"""The cost model against every public tree-vs-chain figure: what each source published, and what
``wb.shapes.cost`` predicts from the same inputs, with the error.

    python -m workbench.shapes.published          # the tables in docs/published-figures.md, as markdown
    python -m workbench.shapes.published --json   # every input and every prediction

No GPU has been lent to this project yet, so these figures are its GPU evidence. Each ``Figure`` holds what
one source published (model, hardware, batch, CUDA graphs or eager, the acceptance tau of the tree and of
the arm it was compared with, the speedup) and says which inputs it lacks and what is assumed in their place.
``predict`` prices one decode step of each arm with ``wb.shapes.cost`` (drafter forward + verify of 1 + budget
tokens per request, a roofline) and predicts the speedup two ways:

- roofline: the forwards alone, no per-step overhead (``overhead_s=0``);
- with overhead: the per-step overhead term set from the *reference* arm's published time (its seconds per
  step, or its speedup over AR with its tau), the same seconds added to both arms. The tree arm's own time
  is never an input, so its prediction is out of sample.

Where the two disagree with the published figure, ``implied_tree_s`` is the tree-only time per step (beyond
its wider verify) that the figure implies: the machinery the model does not see (tree build, masks, per-node
recurrent state, host round trips). Sources that itemize that machinery are quoted beside it.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field

from workbench.shapes.cost import cost
from workbench.shapes.published_figures import FIGURES, Arm, Figure


# ---------------------------------------------------------------------------------------------- prediction
@dataclass
class Prediction:
    """What the cost model says about one ``Figure``. Seconds are per decode step (one drafter forward and one
    verify for every request of the batch); ratios are the tree's tokens/s over the reference's."""

    figure: Figure
    tree_s: float  # the model's step of the tree arm, forwards only
    ref_s: float  # the model's step of the reference arm, forwards only
    overhead_s: float | None  # per-step overhead set from the reference arm's published time
    overhead_clamped: bool  # the reference's forwards alone exceed its published time: overhead 0
    roofline: float | None
    with_overhead: float | None
    implied_tree_s: float | None  # tree-only seconds per step the published figure implies beyond the model
    implied_tau_ratio: float | None  # tau_tree / tau_ref the model needs to give the published figure
    alternatives: list = field(default_factory=list)  # (budget, roofline, with_overhead) at alt_budgets

    @property
    def roofline_error(self) -> float | None:
        return None if self.roofline is None else self.roofline / self.figure.published - 1

    @property
    def overhead_error(self) -> float | None:
        return None if self.with_overhead is None else self.with_overhead / self.figure.published - 1


def _step_seconds(table, arm: Arm, budget: int | None = None) -> float:
    """One step of ``arm`` on the cost table, forwards only: AR is one DECODE forward; a tree or chain is the
    drafter's block forward (when a drafter is costed) plus TARGET_VERIFY of 1 + budget tokens per request."""
    b = arm.budget if budget is None else budget
    if b is None:
        return table.decode["seconds"]
    return table.cycle_seconds(b, 0.0)["cycle_s"]


def _overhead(fig: Figure, table, ref_s: float) -> tuple[float | None, bool]:
    """The per-step overhead (seconds outside the forwards, the same in both arms) that makes the model give
    the reference arm's published time, clamped at 0; None when the source publishes no time for it."""
    if fig.ref_step_s is not None:
        s = fig.ref_step_s - ref_s
    elif fig.ref_speedup_vs_ar is not None:
        # speedup_ref = tau_ref (decode + s) / (ref_s + s), solved for s; AR pays the same overhead per step
        tau, S, dec = fig.ref.tau, fig.ref_speedup_vs_ar, table.decode["seconds"]
        if not tau > S:
            raise ValueError(f"{fig.key}: a speedup over AR ({S}) at or above tau ({tau}) needs a negative overhead")
        s = (S * ref_s - tau * dec) / (tau - S)
    else:
        return None, False
    return max(s, 0.0), s < 0


def _ratio(fig: Figure, tree_s: float, ref_s: float) -> float | None:
    if fig.tree.tau is None or fig.ref.tau is None:
        return None
    return (fig.tree.tau / tree_s) / (fig.ref.tau / ref_s)


def predict(fig: Figure) -> Prediction:
    """The cost model's speedup for ``fig`` from the inputs it published (and those assumed in their place)."""
    budgets = sorted({b for b in (fig.tree.budget, fig.ref.budget, *fig.alt_budgets) if b is not None})
    table = cost(fig.target, gpu=fig.gpu, batch=fig.batch, prompt_len=fig.prompt_len, budgets=budgets,
                 draft_config=fig.draft, dtype=fig.dtype, tp=fig.tp, interconnect=fig.interconnect)
    tree_s, ref_s = _step_seconds(table, fig.tree), _step_seconds(table, fig.ref)
    over, clamped = _overhead(fig, table, ref_s)
    roofline = _ratio(fig, tree_s, ref_s)
    with_over = None if over is None else _ratio(fig, tree_s + over, ref_s + over)
    implied = implied_tau = None
    if roofline is not None:
        s = over or 0.0
        # the tree step that gives the published figure, less what the model prices it at
        implied = fig.tree.tau * (ref_s + s) / (fig.published * fig.ref.tau) - (tree_s + s)
    else:
        s = over or 0.0
        implied_tau = fig.published * (tree_s + s) / (ref_s + s)
    alts = []
    for b in fig.alt_budgets:
        t = _step_seconds(table, fig.tree, b)
        alts.append((b, _ratio(fig, t, ref_s), None if over is None else _ratio(fig, t + over, ref_s + over)))
    return Prediction(fig, tree_s, ref_s, over, clamped, roofline, with_over, implied, implied_tau, alts)


def predictions(figures=FIGURES) -> list[Prediction]:
    return [predict(f) for f in figures]


# ------------------------------------------------------------------------------------------------- output
def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:+.0f}%"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1e3:.1f}"


def _cite(f: Figure) -> str:
    return f"[{f.source}]({f.url})" if f.url else f.source


def _tau(arm: Arm) -> str:
    b = "AR" if arm.budget is None else f"B={arm.budget}"
    return f"{'n/a' if arm.tau is None else f'{arm.tau:.2f}'} ({b})"


def summary(preds: list[Prediction]) -> dict:
    """Median and largest |error| of each prediction over the figures that have one."""
    out = {}
    for name, attr in (("roofline", "roofline_error"), ("with overhead", "overhead_error")):
        errs = [abs(getattr(p, attr)) for p in preds if getattr(p, attr) is not None]
        out[name] = {"figures": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}
    return out


def render_markdown(preds: list[Prediction]) -> str:
    """The tables of docs/published-figures.md, exactly as the doc holds them."""
    head = ("| # | source | model · hardware | batch · mode | tree: tau (budget) | reference: tau (budget) | "
            "published | model, roofline | error | model + overhead | error | tree-only ms/step implied |")
    lines = [head, "|" + "---|" * 12]
    for i, p in enumerate(preds, 1):
        f = p.figure
        lines.append(
            f"| {i} | {_cite(f)} | {f.model} · {f.hardware} | {f.batch} · {f.mode} | "
            f"{f.tree.label}: {_tau(f.tree)} | {f.ref.label}: {_tau(f.ref)} | **{f.published:.2f}x** | "
            f"{_x(p.roofline)} | {_pct(p.roofline_error)} | {_x(p.with_overhead)} | {_pct(p.overhead_error)} | "
            f"{_ms(p.implied_tree_s)} |")
    lines += ["", "| # | published as | the model's step, tree / reference (ms) | per-step overhead (ms) and "
              "where it comes from | tree-only time the source itemizes | inputs missing, and what was assumed |",
              "|" + "---|" * 6]
    for i, p in enumerate(preds, 1):
        f = p.figure
        over = "none" if p.overhead_s is None else _ms(p.overhead_s) + (" (clamped: the forwards alone exceed "
                                                                        "it)" if p.overhead_clamped else "")
        extra = [f"at B={b}: {_x(r)} ({_pct(None if r is None else r / f.published - 1)}), with overhead {_x(w)}"
                 for b, r, w in p.alternatives]
        if p.implied_tau_ratio is not None:
            extra.append(f"tau ratio the model needs for {f.published:.2f}x: {p.implied_tau_ratio:.2f}")
        assumed = "; ".join(f.assumed + tuple(extra))
        lines.append(f"| {i} | {f.published_as} | {_ms(p.tree_s)} / {_ms(p.ref_s)} | {over}: {f.calibration} | "
                     f"{f.tree_machinery or '-'} | {assumed} |")
    s = summary(preds)
    lines += ["", "| prediction | figures | median abs(error) | max abs(error) |", "|---|---|---|---|"]
    for name, v in s.items():
        lines.append(f"| {name} | {v['figures']} | {v['median_abs_error'] * 100:.0f}% | {v['max_abs_error'] * 100:.0f}% |")
    return "\n".join(lines) + "\n"


def to_json(preds: list[Prediction]) -> list[dict]:
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    out = []
    for p in preds:
        f = asdict(p.figure)
        for k in ("target", "draft"):  # configs by name when shipped, else their display name
            v = getattr(p.figure, k)
            f[k] = v if not isinstance(v, dict) else v.get("_name", "config")
        row = {k: clean(v) for k, v in asdict(p).items() if k != "figure"}
        out.append({"figure": f, **row, "roofline_error": p.roofline_error, "overhead_error": p.overhead_error})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.shapes.published",
                                 description="public tree-vs-chain figures against wb.shapes.cost's prediction")
    ap.add_argument("--json", action="store_true", help="every input and prediction as JSON")
    a = ap.parse_args(argv)
    preds = predictions()
    if a.json:
        json.dump({"figures": to_json(preds), "summary": summary(preds)}, sys.stdout, indent=1)
        print()
    else:
        sys.stdout.write(render_markdown(preds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
