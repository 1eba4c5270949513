"""From the runs to the verdict: acceptance per shape, per-step cost per shape, predicted and measured speedup.

    predicted speedup over X = (tokens per forward / X's) x (X's median step time / the shape's)
                             = acceptance gain x per-step cost ratio

A forward step is one target forward over every row (the cycle: draft, tree build and compile, verify,
accept, commit, record); the measured speedup is the paired per-unit ratio of tokens per second of cycle
time (prefill left out: it is the same forward for every shape). What decides is the largest term of
log(predicted) in the direction of the outcome that stands on a structural difference: the acceptance gain
(tokens per forward differ), the verify's extra width (the nodes verified per row differ), or the rest of
the step (per-step overhead); it is named only under a separated result, and a prediction the measurement
missed is said to be missed instead. First of all, per batch size: the fastest policy against the runner-up
(``summary_line``). Beside the verdict on DDTree against the chain: the fastest policy against AR
(``fastest_line``), and each calibrated policy against the best DDTree budget (``versus_best``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from workbench.analysis.paired import ALPHA, PairedRatio, paired_ratio
from workbench.payoff.tree_shapes import CALIBRATED_FAMILIES
from workbench.records.cycle import STAGES

NO_GAIN = 0.02  # an acceptance gain under 2% is no gain: losing then is acceptance's doing
NO_COST = 0.02  # a difference in the rest of the step under 2% of the step time is no cause
NO_WIDTH = 0.5  # verifies whose nodes per row differ by under half a node are of one width
COST_GROUPS = {"draft": ("draft",), "tree": ("tree_build", "tree_compile"), "verify": ("verify",),
               "accept": ("accept",), "commit": ("commit",), "host": ("record", "other")}


@dataclass(frozen=True)
class Decision:
    """The predicted speedup of a shape over a baseline as log-terms, and which one decides it."""

    gain: float  # tokens per forward, shape / baseline
    verify_share: float  # the shape's extra verify time / the baseline's step
    overhead_share: float  # its extra time outside the verify / the baseline's step
    factor: str  # "acceptance", "verify width" or "per-step overhead"
    pays: bool  # the predicted speedup is above 1

    @property
    def step_ratio(self) -> float:
        return 1 + self.verify_share + self.overhead_share

    def to_dict(self) -> dict:
        return {"decides": self.factor, "gain": self.gain, "verify_share": self.verify_share,
                "overhead_share": self.overhead_share, "predicted": self.predicted}

    @property
    def predicted(self) -> float:
        return self.gain / self.step_ratio

    @property
    def terms(self) -> dict:
        """log(predicted) = acceptance + verify width + per-step overhead (the verify's extra time counted
        first, the rest of the step's on top of it)."""
        tv = -math.log1p(self.verify_share)
        return {"acceptance": math.log(self.gain), "verify width": tv,
                "per-step overhead": -math.log(self.step_ratio) - tv}

    def sentence(self, label: str, baseline: str, measured: float | None = None) -> str:
        """'<factor> decides: ...' (the factor's share of the step, signed; the prediction and, given, the measured
        ratio); '' when no term stands on a structural difference."""
        if not self.factor:
            return ""
        seen = "" if measured is None else f", measured {measured:.2f}x"
        return (f"{self.factor} decides: {label} commits {self.gain:.2f}x the tokens per forward of {baseline} while "
                f"its verify costs {signed(100 * self.verify_share)} and the rest of its step "
                f"{signed(100 * self.overhead_share)} of {baseline}'s step time "
                f"(predicted {self.predicted:.2f}x{seen})")

    def figures(self, baseline: str) -> str:
        return (f"tokens per forward {self.gain:.2f}x, verify {signed(100 * self.verify_share)}, the rest of the step "
                f"{signed(100 * self.overhead_share)} of {baseline}'s step time")

    def named(self, measured, separated: bool) -> str | None:
        """The factor a line names under a measured comparison (``measured``: its PairedRatio, or None): only under
        a ``separated`` result whose prediction was not missed, and where a term stands; None otherwise."""
        if not separated or not self.factor or (measured is not None and missed(self.predicted, measured)):
            return None
        return self.factor

    def explain(self, label: str, baseline: str, measured, separated: bool) -> str:
        """The line under a measured comparison (``measured``: its PairedRatio): a prediction the measurement
        missed is said to be missed (the terms then explain nothing); under a ``separated`` result what decides,
        or that no structural difference does; else ''."""
        if measured is not None and missed(self.predicted, measured):
            return (f"prediction missed: {label} was predicted {self.predicted:.2f}x {baseline} and measured "
                    f"{measured.median:.2f}x; the stage medians do not explain the outcome ({self.figures(baseline)})")
        if not separated:
            return ""
        if not self.factor:
            seen = "" if measured is None else f", measured {measured.median:.2f}x"
            return (f"no structural difference explains {label} against {baseline} ({self.figures(baseline)}; "
                    f"predicted {self.predicted:.2f}x{seen})")
        return self.sentence(label, baseline, None if measured is None else measured.median)


def signed(x: float, digits: int = 0, unit: str = "%") -> str:
    """``x`` signed as the lines print it ('+24%', '-3%'); a figure that rounds to zero is '0%', never '-0%'."""
    text = f"{x:+.{digits}f}"
    return (text[1:] if float(text) == 0 else text) + unit


def missed(predicted: float, measured) -> bool:
    """A prediction the measurement missed: on the other side of 1 from the measured median, and outside the
    measured interquartile range (``measured``: a PairedRatio)."""
    lo, hi = measured.iqr
    return (predicted > 1) != (measured.median > 1) and not lo <= predicted <= hi


def what_decides(gain: float, base_stages: dict, shape_stages: dict, widths: tuple | None = None) -> Decision:
    """Which of acceptance, verify width and per-step overhead decides a shape against a baseline: the
    largest log-term in the direction of the outcome among those that stand on a structural difference (an
    acceptance gain of ``NO_GAIN`` or more; verifies of different widths; a rest of the step that differs by
    ``NO_COST`` of the step or more); a loss with under ``NO_GAIN`` acceptance gain is acceptance's; none
    standing: factor ''.

    gain: tokens per forward over the baseline's; *_stages: median seconds per step, stage -> s (``STAGES``);
    widths: nodes verified per row and cycle, (baseline's, shape's) (None: not known, any width may decide)."""
    base = sum(base_stages.values())
    if base <= 0 or gain <= 0:
        raise ValueError(f"what_decides needs a positive gain and baseline step (gain={gain}, step={base})")
    dv = shape_stages.get("verify", 0.0) - base_stages.get("verify", 0.0)
    do = (sum(shape_stages.values()) - shape_stages.get("verify", 0.0)) - (base - base_stages.get("verify", 0.0))
    d = Decision(gain, dv / base, do / base, "", False)
    terms = d.terms
    pays = d.predicted > 1
    structural = {"acceptance": abs(gain - 1) >= NO_GAIN,
                  "verify width": widths is None or None in widths or abs(widths[1] - widths[0]) >= NO_WIDTH,
                  "per-step overhead": abs(d.overhead_share) >= NO_COST}
    if not pays and gain < 1 + NO_GAIN:
        factor = "acceptance"
    else:
        sign = 1 if pays else -1
        standing = [k for k in terms if structural[k] and sign * terms[k] > 0]
        factor = max(standing, key=lambda k: sign * terms[k]) if standing else ""
    return Decision(gain, dv / base, do / base, factor, pays)


@dataclass
class ShapeRow:
    """One shape at one batch size: acceptance, cost, and speedups."""

    label: str
    family: str
    tau: float  # accepted + bonus per row and cycle (pooled)
    tokens_per_forward: float  # tokens committed per target forward (every row; pooled)
    forwards_per_token: float
    step_ms: dict  # group -> median ms per step ("total": median of whole steps); None: a stage it does not run
    steps: int
    nodes: float | None = None  # nodes verified per row and cycle (root included): the verify's width
    gain_vs_chain: float | None = None
    cost_vs_chain: float | None = None  # step time / the chain's
    predicted_vs_chain: float | None = None
    predicted_vs_ar: float | None = None
    measured_vs_chain: PairedRatio | None = None
    measured_vs_ar: PairedRatio | None = None
    decision: Decision | None = None
    queue_vs_chain: float | None = None  # refilled batch: the queue's tokens / cycle time, over the chain's
    mean_rows: float | None = None  # refilled batch: live rows per cycle

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("label", "family", "tau", "tokens_per_forward", "forwards_per_token",
                                            "step_ms", "steps", "nodes", "gain_vs_chain", "cost_vs_chain",
                                            "predicted_vs_chain", "predicted_vs_ar", "queue_vs_chain", "mean_rows")}
        d["measured_vs_chain"] = self.measured_vs_chain.to_dict() if self.measured_vs_chain else None
        d["measured_vs_ar"] = self.measured_vs_ar.to_dict() if self.measured_vs_ar else None
        m = self.measured_vs_chain  # "decides" as a line would say it
        d["decides"] = self.decision.named(m, m.significant) if self.decision and m is not None else None
        return d


def stage_medians(steps: list) -> dict:
    """Median seconds per step of every stage (``STAGES``) and of the whole step, over ``steps``."""
    if not steps:
        return {**{s: 0.0 for s in STAGES}, "total": 0.0}
    out = {s: statistics.median(st.get(s, 0.0) for st in steps) for s in STAGES}
    out["total"] = statistics.median(sum(st.values()) for st in steps)
    return out


def scaled_to_total(med: dict) -> dict:
    """Stage medians scaled to add up to the median step: what-decides splits the step-time ratio the
    prediction uses (per-stage medians alone need not add up to it on a loaded machine)."""
    parts = sum(med[s] for s in STAGES)
    k = med["total"] / parts if parts > 0 else 0.0
    return {s: med[s] * k for s in STAGES}


def grouped_ms(med: dict, drafts: bool = True) -> dict:
    """Median ms per step of each group of stages (``COST_GROUPS``) and of the whole step. A shape that drafts
    nothing (AR) runs no draft and builds no tree: those groups are None, and the little time the cycle spends
    there (laying out its root-only tree) is counted in host."""
    out = {g: 1e3 * sum(med[s] for s in stages) for g, stages in COST_GROUPS.items()}
    if not drafts:
        out["host"] += out["draft"] + out["tree"]
        out["draft"] = out["tree"] = None
    out["total"] = 1e3 * med["total"]
    return out


@dataclass
class BatchVerdict:
    """Every shape at one batch size, the best DDTree budget and the verdict line."""

    batch: int
    units: int
    rows: list  # ShapeRow, in the sweep's order
    mode: str = "static"  # "static" (a window of B prompts until its slowest row ends) or "refilled"
    best_budget: str | None = None  # the DDTree(N) with the highest measured median speedup over the chain
    best_vs_runner_up: PairedRatio | None = None
    predicted_best: str | None = None
    verdict: str = ""  # DDTree's budgets against the chain (or why there is no verdict)
    decides: str = ""
    fastest: str = ""  # the fastest policy measured, AR included
    summary: str = ""  # one line: the fastest policy against the runner-up, its p-value and what decides
    versus_best: list = field(default_factory=list)  # Challenge per calibrated policy, against best_budget
    versus_best_note: str = ""  # why there is no such comparison, when there is none
    lossless: list = field(default_factory=list)  # failure lines (greedy only)

    def row(self, label: str) -> ShapeRow:
        return next(r for r in self.rows if r.label == label)


def analyse(sw, shapes, chain: str = "DFlash", ar: str = "AR") -> BatchVerdict:
    """Tables of one batch size's sweep: static (``workbench.payoff.measure.Sweep``) or refilled
    (``workbench.payoff.refill.RefilledSweep``); units are windows or prompts, as the sweep pairs them."""
    units = [[sw.unit(s.label, i) for i in range(len(sw.units))] for s in shapes]
    meds, rows = {}, []
    for s, us in zip(shapes, units):
        steps = sw.steps(s.label)
        med = meds[s.label] = stage_medians(steps)
        tokens, forwards, rc, accepted = sw.totals(s.label)
        row_cycles, nodes = sum(u.row_cycles for u in us), sum(u.nodes for u in us)
        rows.append(ShapeRow(s.label, s.family, accepted / rc if rc else 0.0,
                             tokens / forwards if forwards else 0.0, forwards / tokens if tokens else 0.0,
                             grouped_ms(med, s.policy.drafts), len(steps),
                             nodes / row_cycles if nodes and row_cycles else None))
    by = {r.label: r for r in rows}
    tps = {s.label: [u.tokens_per_s for u in us] for s, us in zip(shapes, units)}
    if sw.mode == "refilled":
        for r in rows:
            r.mean_rows = sw.mean_rows(r.label)
            if chain in by and sw.throughput(chain):
                r.queue_vs_chain = sw.throughput(r.label) / sw.throughput(chain)
    n = len(sw.units)
    for r in rows:
        if chain in by and by[chain].tokens_per_forward:
            c = by[chain]
            r.gain_vs_chain = r.tokens_per_forward / c.tokens_per_forward
            r.cost_vs_chain = meds[r.label]["total"] / meds[chain]["total"] if meds[chain]["total"] else None
            if r.cost_vs_chain:
                r.predicted_vs_chain = r.gain_vs_chain / r.cost_vs_chain
                r.decision = what_decides(r.gain_vs_chain, scaled_to_total(meds[chain]),
                                          scaled_to_total(meds[r.label]), (c.nodes, r.nodes))
            if r.label != chain and n >= 2:
                r.measured_vs_chain = paired_ratio(tps[r.label], tps[chain], r.label, chain, min_pairs=1,
                                                   what="units")
        if ar in by and meds[r.label]["total"] and by[ar].tokens_per_forward:
            r.predicted_vs_ar = (r.tokens_per_forward / by[ar].tokens_per_forward) * meds[ar]["total"] / \
                meds[r.label]["total"]
            if r.label != ar and n >= 2:
                r.measured_vs_ar = paired_ratio(tps[r.label], tps[ar], r.label, ar, min_pairs=1, what="units")
    out = BatchVerdict(sw.batch, n, rows, sw.mode)
    trees = [r for r in rows if r.family == "tree" and r.measured_vs_chain is not None]
    where = at_batch(sw.batch, sw.mode)
    out.verdict, out.decides = verdict_line(where, trees, chain)
    out.fastest = fastest_line(where, rows, ar)
    out.summary = summary_line(where, rows, tps, meds, ar if ar in by else chain)
    if trees:
        ranked = sorted(trees, key=lambda r: -r.measured_vs_chain.median)
        best = ranked[0]
        out.best_budget = best.label
        out.predicted_best = max(trees, key=lambda r: r.predicted_vs_chain or 0.0).label
        if len(ranked) > 1:
            out.best_vs_runner_up = paired_ratio(tps[best.label], tps[ranked[1].label], best.label, ranked[1].label,
                                                 min_pairs=1, what="units")
    out.versus_best, out.versus_best_note = versus_best(where, rows, out.best_budget, tps, meds)
    return out


def at_batch(batch, mode: str = "") -> str:
    """How the lines name where they were measured: 'at batch 1', 'at batch 8 (refilled batch)'; a text
    already made is kept, and a bare batch size names no mode."""
    if isinstance(batch, str):
        return batch
    return f"at batch {batch}" if batch == 1 or not mode else f"at batch {batch} ({mode} batch)"


def bonferroni(alpha: float, k: int, what: str, plural: str | None = None) -> tuple[float, str]:
    """The per-comparison threshold when ``k`` comparisons are tried at once, and the rule as the lines print
    it ('Bonferroni over 4 budgets: p<0.0125'), so no line leaves its rule to be guessed."""
    each = alpha / k
    return each, f"Bonferroni over {k} {what if k == 1 else plural or what + 's'}: p<{each:.3g}"


def figure(row, m: PairedRatio, baseline: str, rule: str) -> str:
    lo, hi = m.iqr
    return (f"{row.label} {m.median:.2f}x {baseline} (IQR {lo:.2f}-{hi:.2f}, worst {m.tails[0]:.2f}, "
            f"Wilcoxon p={m.wilcoxon_p:.2g}, sign p={m.sign_p:.2g}, {m.n} paired units; {rule})")


def verdict_line(batch, trees: list, chain: str, alpha: float = ALPHA) -> tuple[str, str]:
    """The verdict over every DDTree budget at one batch size, and what decides it.

    A budget counts as faster (or slower) than the chain only where its paired Wilcoxon p-value is below
    ``alpha`` / the number of budgets (Bonferroni: several budgets are tried at once); the line says so, since
    the tables' order column is uncorrected. "pays off": some budget is faster (the fastest of those is named);
    "does not pay off": every budget is slower; otherwise "not shown to pay off", naming the best median.
    What decides is read from the named budget's prediction. No budget: a line saying why no verdict."""
    where = at_batch(batch)
    if not trees:
        return (f"{where} no verdict on DDTree: no DDTree budget among the policies (the verdict compares "
                f"DDTree budgets against {chain}); add ddtree:N, e.g. ddtree:8", "")
    each, rule = bonferroni(alpha, len(trees), "budget")
    faster = [r for r in trees if r.measured_vs_chain.wilcoxon_p < each and r.measured_vs_chain.median > 1]
    slower = [r for r in trees if r.measured_vs_chain.wilcoxon_p < each and r.measured_vs_chain.median < 1]
    best = max(faster or trees, key=lambda r: r.measured_vs_chain.median)
    fig = figure(best, best.measured_vs_chain, chain, rule)
    if faster:
        head = f"{where} DDTree pays off over {chain}: {fig}"
    elif len(slower) == len(trees):
        head = f"{where} DDTree does not pay off over {chain}: every budget is slower; the best, {fig}"
    else:
        others = f"; slower: {', '.join(r.label for r in slower)}" if slower else ""
        head = f"{where} DDTree is not shown to pay off over {chain} (no budget significantly faster{others}): {fig}"
    separated = best.measured_vs_chain.wilcoxon_p < each
    why = best.decision.explain(best.label, chain, best.measured_vs_chain, separated) if best.decision else ""
    return head, why


def fastest_line(batch, rows: list, ar: str = "AR", alpha: float = ALPHA) -> str:
    """The fastest policy measured, AR included (a tree that beats DFlash can still lose to plain decoding at
    batch 8). Every speculative shape is compared with AR, paired, Bonferroni over the shapes;
    '' when AR was not measured."""
    where = at_batch(batch)
    rivals = [r for r in rows if r.label != ar and r.measured_vs_ar is not None]
    if not rivals:
        return ""
    each, rule = bonferroni(alpha, len(rivals), "shape")
    best = max(rivals, key=lambda r: r.measured_vs_ar.median)
    m = best.measured_vs_ar
    fig = figure(best, m, ar, rule)
    if m.median > 1 and m.wilcoxon_p < each:
        return f"fastest {where} (the highest median against {ar}, and separated from it): {fig}"
    if m.median <= 1 and m.wilcoxon_p < each:
        return f"{where} no speculative shape beats {ar} here: {ar} is the fastest measured; the best of the rest, {fig}"
    return (f"{where} no speculative shape is shown faster than {ar} (the fastest is not separated from "
            f"{ar}): the best median, {fig}")


@dataclass
class Challenge:
    """One calibrated policy against the best DDTree budget at one batch size: the paired ratio of tokens per
    second, the outcome under the rule, and the term of log(predicted) that decides."""

    label: str
    baseline: str  # the best DDTree budget (the highest measured median against the chain)
    measured: PairedRatio
    rule: str  # 'Bonferroni over 5 policies: p<0.01'
    outcome: str  # "faster", "slower" or "not separated"
    decision: Decision | None

    @property
    def line(self) -> str:
        said = {"faster": "faster than", "slower": "slower than", "not separated": "not separated from"}
        return f"{figure(self, self.measured, self.baseline, self.rule)}: {said[self.outcome]} {self.baseline}"

    @property
    def explanation(self) -> str:
        """What decides (a separated outcome only), or that the prediction was missed; '' otherwise."""
        if self.decision is None:
            return ""
        return self.decision.explain(self.label, self.baseline, self.measured, self.outcome != "not separated")

    def to_dict(self) -> dict:
        decision = self.decision.to_dict() if self.decision else dict.fromkeys(
            ("decides", "gain", "verify_share", "overhead_share", "predicted"))
        if self.decision is not None:  # "decides" as the text says it
            decision["prediction_missed"] = missed(self.decision.predicted, self.measured)
            decision["decides"] = self.decision.named(self.measured, self.outcome != "not separated")
        return {"label": self.label, "baseline": self.baseline, "measured": self.measured.to_dict(),
                "rule": self.rule, "outcome": self.outcome, **decision}


def versus_best(batch, rows: list, best: str | None, tps: dict, meds: dict,
                alpha: float = ALPHA) -> tuple[list, str]:
    """Each calibrated policy (``CALIBRATED_FAMILIES``) against the best DDTree budget, paired per unit (the
    goal is a policy that beats the best budget, not only the chain). Faster or slower only where the
    Wilcoxon p is below ``alpha`` / the number of calibrated policies (several are tried at once); what decides
    splits log(predicted) against the best budget into acceptance, verify width and per-step overhead, as
    the verdict does against the chain. -> (Challenges, '' or a line saying why there are none).

    tps: label -> tokens per second per unit; meds: label -> stage medians (``stage_medians``)."""
    where = at_batch(batch)
    mine = [r for r in rows if r.family in CALIBRATED_FAMILIES]
    if not mine:
        return [], ""
    if best is None:
        return [], (f"{where} no calibrated policy is compared with DDTree: no DDTree budget among the "
                    "policies (they are compared with the best one); add ddtree:N, e.g. ddtree:8")
    n = len(tps[best])
    if n < 2:
        return [], f"{where} no calibrated policy is compared with {best}: {n} unit(s), nothing to pair"
    each, rule = bonferroni(alpha, len(mine), "calibrated policy", "calibrated policies")
    base = next(r for r in rows if r.label == best)
    out = []
    for r in mine:
        m = paired_ratio(tps[r.label], tps[best], r.label, best, min_pairs=1, what="units")
        outcome = "not separated" if m.wilcoxon_p >= each else ("faster" if m.median > 1 else "slower")
        decision = None
        if base.tokens_per_forward and r.tokens_per_forward and meds[best]["total"]:
            decision = what_decides(r.tokens_per_forward / base.tokens_per_forward, scaled_to_total(meds[best]),
                                    scaled_to_total(meds[r.label]), (base.nodes, r.nodes))
        out.append(Challenge(r.label, best, m, rule, outcome, decision))
    return out, ""


def summary_line(batch, rows: list, tps: dict, meds: dict, reference: str, alpha: float = ALPHA) -> str:
    """One line for one batch size: the fastest policy measured (AR included: the highest median of the paired
    per-unit ratios to ``reference``), its ratio to the runner-up with the paired p-value, and what decides
    (``Decision.explain``: a separated result on a structural difference only; a missed prediction is said
    to be missed). tps: label -> tokens per second per unit; meds: label -> stage medians."""
    where = at_batch(batch)
    ref = tps.get(reference)
    if ref is None or not rows:
        return ""

    def ratio(label: str) -> float:
        return statistics.median(a / b if b > 0 else 0.0 for a, b in zip(tps[label], ref)) if ref else 0.0

    ranked = sorted(rows, key=lambda r: -ratio(r.label))
    first = ranked[0]
    if len(ranked) == 1:
        return f"{where}: {first.label} is the only policy measured"
    second = ranked[1]
    n = len(tps[first.label])
    if n < 2:
        return (f"{where}: fastest {first.label}, then {second.label} (the highest median against {reference}; "
                f"{n} unit, nothing to pair: no p-value)")
    known = [x for x in (first.measured_vs_ar, first.measured_vs_chain) if x is not None and x.baseline == second.label]
    m = known[0] if known else paired_ratio(tps[first.label], tps[second.label], first.label, second.label,
                                            min_pairs=1, what="units")
    separated = m.wilcoxon_p < alpha
    head = (f"{where}: fastest {first.label}, {m.median:.2f}x the runner-up {second.label} (Wilcoxon "
            f"p={m.wilcoxon_p:.2g}, {m.n} paired units; {'separated' if separated else 'not separated'} at "
            f"p<{alpha:g})")
    why = ""
    if second.tokens_per_forward and first.tokens_per_forward and meds[second.label]["total"]:
        d = what_decides(first.tokens_per_forward / second.tokens_per_forward, scaled_to_total(meds[second.label]),
                         scaled_to_total(meds[first.label]), (second.nodes, first.nodes))
        why = d.explain(first.label, second.label, m, separated)
    if not separated and not why:
        why = "either may be the faster: nothing decides"
    return f"{head}; {why}" if why else head
