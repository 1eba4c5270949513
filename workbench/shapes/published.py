"""The cost model against every public tree-vs-chain figure: what each source published, and what
``wb.shapes.cost`` predicts from the same inputs, with the error.

    python -m workbench.shapes.published          # the tables in docs/published-figures.md, as markdown
    python -m workbench.shapes.published --json   # every input and every prediction

No GPU has been lent to this project yet, so these figures are its GPU evidence. Each ``Figure`` holds what
one source published (model, hardware, batch, engine and graph mode, the acceptance tau of the tree and of the
arm it was compared with, the speedup) and says which inputs it lacks and what is assumed in their place.
A step of each arm is priced with ``wb.shapes.cost`` (drafter forward + verify of 1 + budget tokens per
request, a roofline), plus the per-step overhead both arms share, set from the *reference* arm's published
time (its seconds per step, or its speedup over AR with its tau), plus, for a tree, the tree machinery: a
share of its step per engine kind and graph mode (``workbench.shapes.machinery``). Four predictions of the
speedup, tau_tree / step_tree over tau_ref / step_ref:

- tau ratio: tau_tree / tau_ref, the steps taken as equal (the baseline the model must beat);
- roofline: the forwards alone;
- + overhead: the forwards and the shared overhead, no tree machinery;
- model: all three terms, the machinery's share fitted **leave-one-source-out**: on every figure but those of
  this figure's source (``origin_of``), so no figure's own number, nor its source's, enters its prediction.

A figure trains the share only if its source published the reference arm's time and the prediction depends on
the share (not a tree against a tree of the same size). ``implied_tree_s`` is the tree-only time per step the
published figure implies beyond the forwards and the shared overhead; sources that itemize theirs are quoted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field, replace

from workbench.shapes import machinery
from workbench.shapes.cost import cost
from workbench.shapes.published_figures import FIGURES, Arm, Figure, origin_of


# ---------------------------------------------------------------------------------------------- the steps
@dataclass(frozen=True)
class Priced:
    """One figure's forwards on the cost model, computed once: seconds per step of each arm's forwards, one
    DECODE forward, and the tree arm's forwards at each alternative budget."""

    figure: Figure
    tree_s: float
    ref_s: float
    decode_s: float
    alt_s: tuple = ()  # (budget, tree forwards in seconds)

    @property
    def engine(self) -> str:
        return self.figure.engine

    @property
    def graph(self) -> str:
        return self.figure.graph

    @property
    def trains(self) -> bool:
        """Whether this figure may fit the machinery share: its reference arm's time is published (else its
        step is a bare roofline) and its prediction moves with the share (not a tree against an equal tree)."""
        f = self.figure
        if f.tree.tau is None or f.ref.tau is None or (f.ref_step_s is None and f.ref_speedup_vs_ar is None):
            return False
        return not (f.ref.tree and f.ref.budget == f.tree.budget)


def _forwards(table, arm: Arm, budget: int | None = None) -> float:
    """One step of ``arm`` on the cost table, forwards only: AR is one DECODE forward; a tree or chain is the
    drafter's block forward (when a drafter is costed) plus TARGET_VERIFY of 1 + budget tokens per request."""
    b = arm.budget if budget is None else budget
    if b is None:
        return table.decode["seconds"]
    return table.cycle_seconds(b, 0.0, tree=False)["cycle_s"]


def best_of_sweep(fig: Figure) -> Figure:
    """``fig`` with its tree budget set where the source publishes only the fastest of a sweep (``fig.sweep``):
    the largest swept budget whose verify the roofline prices free (``CostTable.free_budget``), else the
    smallest. Tau grows slowly with the budget while a verify past that knee costs linearly more, so the fastest
    budget of a sweep sits at or below it. A figure without a sweep is returned as it is."""
    if not fig.sweep:
        return fig
    table = cost(fig.target, gpu=fig.gpu, batch=fig.batch, prompt_len=fig.prompt_len, budgets=[min(fig.sweep)],
                 dtype=fig.dtype, tp=fig.tp, interconnect=fig.interconnect, weight_bits=fig.weight_bits)
    free = table.free_budget
    budget = max((b for b in fig.sweep if b <= free), default=min(fig.sweep))
    return replace(fig, tree=replace(fig.tree, budget=budget))


def price(fig: Figure) -> Priced:
    fig = best_of_sweep(fig)
    budgets = sorted({b for b in (fig.tree.budget, fig.ref.budget, *fig.alt_budgets) if b is not None})
    table = cost(fig.target, gpu=fig.gpu, batch=fig.batch, prompt_len=fig.prompt_len, budgets=budgets,
                 draft_config=fig.draft, dtype=fig.dtype, tp=fig.tp, interconnect=fig.interconnect,
                 weight_bits=fig.weight_bits)
    alts = tuple((b, _forwards(table, fig.tree, b)) for b in fig.alt_budgets)
    return Priced(fig, _forwards(table, fig.tree), _forwards(table, fig.ref), table.decode["seconds"], alts)


def overhead(p: Priced, ref_share: float = 0.0) -> tuple[float | None, bool]:
    """The per-step overhead both arms share (seconds outside the forwards and the tree machinery) that makes
    the reference arm take its published time, clamped at 0, and whether it was clamped; None when the source
    publishes no time for it. ``ref_share``: the reference arm's own machinery share, when it is a tree. A
    speedup over AR that no finite overhead reaches gives infinity (both steps are then all overhead)."""
    f = p.figure
    if f.ref_step_s is not None:
        s = f.ref_step_s / (1 + ref_share) - p.ref_s
    elif f.ref_speedup_vs_ar is not None:
        # speedup_ref = tau_ref (decode + s) / ((ref_s + s)(1 + ref_share)), solved for s; AR pays the same s
        tau, S = f.ref.tau, f.ref_speedup_vs_ar * (1 + ref_share)
        if tau <= S:
            return float("inf"), False
        s = (S * p.ref_s - tau * p.decode_s) / (tau - S)
    else:
        return None, False
    return max(s, 0.0), s < 0


def steps(p: Priced, share: float, tree_s: float | None = None) -> tuple[float, float]:
    """Seconds per step of the tree arm and of the reference arm at machinery ``share``: each arm's forwards
    plus the shared overhead, times (1 + its share) for a tree (a chain and AR pay none)."""
    f = p.figure
    h_tree = share * f.tree_steps
    h_ref = h_tree if f.ref.tree else 0.0
    s, _ = overhead(p, h_ref)
    s = 0.0 if s is None else s
    t = p.tree_s if tree_s is None else tree_s
    if s == float("inf"):  # only the shares are left: both steps are the same overhead
        return 1 + h_tree, 1 + h_ref
    return (t + s) * (1 + h_tree), (p.ref_s + s) * (1 + h_ref)


def speedup_at(p: Priced, share: float, tree_s: float | None = None) -> float | None:
    """The predicted tree speedup over the reference at machinery ``share``; None without both taus."""
    f = p.figure
    if f.tree.tau is None or f.ref.tau is None:
        return None
    tree, ref = steps(p, share, tree_s)
    return (f.tree.tau / tree) / (f.ref.tau / ref)


def loss(rows, share: float) -> float:
    """The fit's objective: sum over ``rows`` of |log(predicted / published)| at ``share``."""
    return sum(machinery.log_error(speedup_at(p, share), p.figure.published) for p in rows)


def fit_all(priced: list[Priced]) -> machinery.TreeMachinery:
    """The machinery shares fitted on every figure of ``priced`` that trains them (``Priced.trains``)."""
    return machinery.fit([p for p in priced if p.trains], loss)


def leave_one_source_out(priced: list[Priced]) -> dict[str, machinery.TreeMachinery]:
    """For every origin, the shares fitted on the training figures of every *other* origin."""
    origins = sorted({origin_of(p.figure) for p in priced})
    return {o: machinery.fit([p for p in priced if p.trains and origin_of(p.figure) != o], loss) for o in origins}


# ---------------------------------------------------------------------------------------------- prediction
@dataclass
class Prediction:
    """What the cost model says about one ``Figure``. Seconds are per decode step (one drafter forward and one
    verify for every request of the batch); ratios are the tree's tokens/s over the reference's."""

    figure: Figure
    tree_s: float  # the model's step of the tree arm, forwards only
    ref_s: float  # the model's step of the reference arm, forwards only
    overhead_s: float | None  # per-step overhead set from the reference arm's published time, no machinery
    overhead_clamped: bool  # the reference's forwards alone exceed its published time: overhead 0
    roofline: float | None
    with_overhead: float | None
    implied_tree_s: float | None  # tree-only seconds per step the published figure implies beyond the model
    implied_tau_ratio: float | None  # tau_tree / tau_ref the model needs to give the published figure
    alternatives: list = field(default_factory=list)  # (budget, roofline, with_overhead, model) at alt_budgets
    tau_ratio: float | None = None  # tau_tree / tau_ref
    model: float | None = None  # forwards + overhead + tree machinery at the share below
    share: float | None = None  # the machinery share used (fitted without this figure's source)
    share_level: str = ""  # where it came from: engine+graph, graph or all (machinery.LEVELS)
    machinery_s: float | None = None  # the tree arm's machinery per step at that share
    trains: bool = False  # whether this figure fits the share for the other sources

    @property
    def roofline_error(self) -> float | None:
        return None if self.roofline is None else self.roofline / self.figure.published - 1

    @property
    def overhead_error(self) -> float | None:
        return None if self.with_overhead is None else self.with_overhead / self.figure.published - 1

    @property
    def tau_ratio_error(self) -> float | None:
        return None if self.tau_ratio is None else self.tau_ratio / self.figure.published - 1

    @property
    def model_error(self) -> float | None:
        return None if self.model is None else self.model / self.figure.published - 1


def predict(fig: Figure, tree_machinery: machinery.TreeMachinery | None = None, priced: Priced | None = None
            ) -> Prediction:
    """The cost model's speedup for ``fig`` from the inputs it published (and those assumed in their place).
    ``tree_machinery``: the shares to use (default ``machinery.FITTED``, fitted on every figure, this one
    included when it trains: ``predictions`` holds each figure's source out instead)."""
    p = priced or price(fig)
    m = machinery.FITTED if tree_machinery is None else tree_machinery
    over, clamped = overhead(p)
    roofline = _bare(p)
    with_over = None if over is None else speedup_at(p, 0.0)
    implied = implied_tau = None
    s = over or 0.0
    if roofline is not None:
        # the tree step that gives the published figure, less what the forwards and the overhead price it at
        implied = fig.tree.tau * (p.ref_s + s) / (fig.published * fig.ref.tau) - (p.tree_s + s)
    else:
        implied_tau = fig.published * (p.tree_s + s) / (p.ref_s + s)
    share, level = m.share(fig.engine, fig.graph) if fig.graph in machinery.GRAPH_MODES else (None, "")
    model = None if share is None else speedup_at(p, share)
    mach = None
    if model is not None and overhead(p, share * fig.tree_steps if fig.ref.tree else 0.0)[0] != float("inf"):
        mach = steps(p, share)[0] * (1 - 1 / (1 + share * fig.tree_steps))  # (forwards + overhead) x share
    alts = [(b, _bare(p, t), None if over is None else speedup_at(p, 0.0, t),
             None if share is None else speedup_at(p, share, t)) for b, t in p.alt_s]
    tau_ratio = None if fig.tree.tau is None else fig.tree.tau / fig.ref.tau
    return Prediction(fig, p.tree_s, p.ref_s, over, clamped, roofline, with_over, implied, implied_tau, alts,
                      tau_ratio, model, share, level, mach, p.trains)


def _bare(p: Priced, tree_s: float | None = None) -> float | None:
    """The forwards alone: no overhead, no machinery."""
    f = p.figure
    if f.tree.tau is None or f.ref.tau is None:
        return None
    return (f.tree.tau / (p.tree_s if tree_s is None else tree_s)) / (f.ref.tau / p.ref_s)


def predictions(figures=FIGURES) -> list[Prediction]:
    """Every figure's prediction, its machinery share fitted leave-one-source-out on ``figures``."""
    priced = [price(f) for f in figures]
    held_out = leave_one_source_out(priced)
    return [predict(p.figure, held_out[origin_of(p.figure)], p) for p in priced]


# ------------------------------------------------------------------------------------------------- scores
PREDICTORS = (("tau ratio", "tau_ratio_error"), ("roofline", "roofline_error"), ("with overhead", "overhead_error"),
              ("model (leave-one-source-out)", "model_error"))


def score(errors) -> dict:
    """Median and largest |error| of ``errors`` (predicted / published - 1), and how many lean each way."""
    errs = [e for e in errors if e is not None]
    if not errs:
        return {"figures": 0, "median_abs_error": None, "max_abs_error": None, "over": 0, "under": 0}
    return {"figures": len(errs), "median_abs_error": statistics.median(abs(e) for e in errs),
            "max_abs_error": max(abs(e) for e in errs), "over": sum(e > 0 for e in errs),
            "under": sum(e < 0 for e in errs)}


def summary(preds: list[Prediction]) -> dict:
    """Each prediction's score over the figures that have one (``score``)."""
    return {name: score(getattr(p, attr) for p in preds) for name, attr in PREDICTORS}


def by_source(preds: list[Prediction]) -> dict:
    """Per origin: the tau ratio's and the model's score over its figures."""
    out = {}
    for o in sorted({origin_of(p.figure) for p in preds}):
        mine = [p for p in preds if origin_of(p.figure) == o]
        out[o] = {"tau ratio": score(p.tau_ratio_error for p in mine),
                  "model": score(p.model_error for p in mine)}
    return out


GOAL_MEDIAN = 0.10  # the model's median abs(error), leave-one-source-out
GOAL_OF_TAU = 2 / 3  # at most this share of the tau ratio's own median abs(error)


def goals(preds: list[Prediction]) -> list[dict]:
    """The three goals the model is held to, each with its number and whether it is met."""
    s = summary(preds)
    m, t = s["model (leave-one-source-out)"], s["tau ratio"]
    return [
        {"goal": f"median abs(error) <= {GOAL_MEDIAN:.0%}", "value": f"{m['median_abs_error']:.1%}",
         "met": m["median_abs_error"] <= GOAL_MEDIAN},
        {"goal": "as many over- as under-predicted", "value": f"{m['over']} over, {m['under']} under",
         "met": m["over"] == m["under"]},
        {"goal": "at most two thirds of the tau ratio's median abs(error)",
         "value": f"{m['median_abs_error']:.1%} against {GOAL_OF_TAU:.3f} x {t['median_abs_error']:.1%} = "
                  f"{GOAL_OF_TAU * t['median_abs_error']:.1%}",
         "met": m["median_abs_error"] <= GOAL_OF_TAU * t["median_abs_error"]},
    ]


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


def _machinery(p: Prediction) -> str:
    if p.share is None:
        return "n/a"
    f = p.figure
    steps_note = f", on {f.tree_steps:.0%} of steps" if f.tree_steps < 1 else ""
    return f"{f.engine}/{f.graph} {p.share:.3f} ({p.share_level}{steps_note}): {_ms(p.machinery_s)}"


def _score_row(name: str, v: dict) -> str:
    if not v["figures"]:
        return f"| {name} | 0 | n/a | n/a | n/a |"
    return (f"| {name} | {v['figures']} | {v['median_abs_error'] * 100:.1f}% | {v['over']} / {v['under']} | "
            f"{v['max_abs_error'] * 100:.0f}% |")


def render_markdown(preds: list[Prediction]) -> str:
    """The tables of docs/published-figures.md, exactly as the doc holds them."""
    lines = ["| # | source | model · hardware | batch · mode | tree: tau (budget) | reference: tau (budget) | "
             "published | tau ratio | error | model (held out) | error | machinery: share (from), ms/step |",
             "|" + "---|" * 12]
    for i, p in enumerate(preds, 1):
        f = p.figure
        lines.append(
            f"| {i} | {_cite(f)} | {f.model} · {f.hardware} | {f.batch} · {f.mode} | "
            f"{f.tree.label}: {_tau(f.tree)} | {f.ref.label}: {_tau(f.ref)} | **{f.published:.2f}x** | "
            f"{_x(p.tau_ratio)} | {_pct(p.tau_ratio_error)} | {_x(p.model)} | {_pct(p.model_error)} | "
            f"{_machinery(p)} |")
    lines += ["", "| # | published as | forwards, tree / reference (ms) | shared overhead (ms) and where it comes "
              "from | forwards only; + overhead (error); tree-only ms implied | tree-only time the source itemizes | "
              "inputs missing, and what was assumed |", "|" + "---|" * 7]
    for i, p in enumerate(preds, 1):
        f = p.figure
        over = "none" if p.overhead_s is None else _ms(p.overhead_s) + (" (clamped: the forwards alone exceed "
                                                                        "it)" if p.overhead_clamped else "")
        extra = [f"at B={b}: forwards only {_x(r)}, + overhead {_x(w)}, model {_x(m)} "
                 f"({_pct(None if m is None else m / f.published - 1)})" for b, r, w, m in p.alternatives]
        if p.implied_tau_ratio is not None:
            extra.append(f"tau ratio the model needs for {f.published:.2f}x: {p.implied_tau_ratio:.2f}")
        assumed = "; ".join(f.assumed + tuple(extra))
        bare = (f"{_x(p.roofline)} ({_pct(p.roofline_error)}); {_x(p.with_overhead)} ({_pct(p.overhead_error)}); "
                f"{_ms(p.implied_tree_s)}")
        lines.append(f"| {i} | {f.published_as} | {_ms(p.tree_s)} / {_ms(p.ref_s)} | {over}: {f.calibration} | "
                     f"{bare} | {f.tree_machinery or '-'} | {assumed} |")
    lines += ["", "| prediction | figures | median abs(error) | over / under | max abs(error) |",
              "|---|---|---|---|---|"]
    lines += [_score_row(name, v) for name, v in summary(preds).items()]
    lines += ["", "| source (held out together) | figures | tau ratio: median abs(error), over / under | "
              "model: median abs(error), over / under |", "|---|---|---|---|"]
    for o, v in by_source(preds).items():
        t, m = v["tau ratio"], v["model"]
        if t["figures"]:
            lines.append(f"| {o} | {t['figures']} | {t['median_abs_error'] * 100:.1f}%, {t['over']} / {t['under']} | "
                         f"{m['median_abs_error'] * 100:.1f}%, {m['over']} / {m['under']} |")
    fitted = fit_all([price(p.figure) for p in preds])
    lines += ["", f"| engine | graph | machinery share, fitted on all {fitted.fitted_on} training figures |",
              "|---|---|---|"]
    lines += [f"| {r['engine']} | {r['graph']} | {r['share']:.3f} |" for r in fitted.rows()]
    lines += ["", "| goal | the model, leave-one-source-out | met |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['value']} | {'yes' if g['met'] else 'no'} |" for g in goals(preds)]
    return "\n".join(lines) + "\n"


def to_json(preds: list[Prediction]) -> dict:
    """Every figure's inputs and predictions, the scores, and the shares fitted on all figures."""
    out = []
    for p in preds:
        f = asdict(p.figure)
        for k in ("target", "draft"):  # configs by name when shipped, else their display name
            v = getattr(p.figure, k)
            f[k] = v if not isinstance(v, dict) else v.get("_name", "config")
        row = {k: v for k, v in asdict(p).items() if k != "figure"}
        out.append({"figure": f, "origin": origin_of(p.figure), **row,
                    **{attr: getattr(p, attr) for _, attr in PREDICTORS}})
    fitted = fit_all([price(p.figure) for p in preds])
    return {"figures": out, "summary": summary(preds), "by_source": by_source(preds), "goals": goals(preds),
            "fitted_shares": fitted.rows()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.shapes.published",
                                 description="public tree-vs-chain figures against wb.shapes.cost's prediction")
    ap.add_argument("--json", action="store_true", help="every input and prediction as JSON")
    a = ap.parse_args(argv)
    preds = predictions()
    if a.json:
        json.dump(to_json(preds), sys.stdout, indent=1)
        print()
    else:
        sys.stdout.write(render_markdown(preds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
