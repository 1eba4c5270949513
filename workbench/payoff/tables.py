"""``PaysOff`` as text: per batch size the acceptance, cost and speedup tables and the verdict; then the
branching rates and the counterfactual rows. Pure: result -> str."""
from __future__ import annotations

from workbench.analysis.paired import ALPHA
from workbench.payoff.verdict import missed, signed
from workbench.records.texttable import legend, text_table

CHAIN = "DFlash"
# The tables' order columns test each row on its own; the verdict lines say their own (stricter) rule.
UNCORRECTED = f"Wilcoxon p<{ALPHA:g}, uncorrected"


def _x(v, fmt=".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _predicted(p, m) -> str:
    """A predicted speedup, marked where the measurement missed it."""
    return _x(p) + (" missed" if p is not None and m is not None and missed(p, m) else "")


def _measured(m) -> list[str]:
    if m is None:
        return ["-", "-", "-", "-"]
    lo, hi = m.iqr
    return [f"{m.median:.2f}", f"{lo:.2f}-{hi:.2f}", f"{m.tails[0]:.2f}", f"{m.wilcoxon_p:.2g}/{m.sign_p:.2g}"]


def batch_tables(v) -> str:
    refilled = v.mode == "refilled"
    acc = [[r.label, r.family, f"{r.forwards_per_token:.3f}", f"{r.tau:.2f}", f"{r.tokens_per_forward:.2f}",
            _x(r.nodes, ".1f"), _x(r.gain_vs_chain), *([_x(r.mean_rows)] if refilled else [])] for r in v.rows]
    groups = ["draft", "tree", "verify", "accept", "commit", "host", "total"]
    cost = [[r.label, *(_x(r.step_ms[g]) for g in groups), _x(r.cost_vs_chain), str(r.steps)] for r in v.rows]
    speed = [[r.label, _predicted(r.predicted_vs_chain, r.measured_vs_chain), *_measured(r.measured_vs_chain),
              (r.measured_vs_chain.order if r.measured_vs_chain else "-"), *([_x(r.queue_vs_chain)] if refilled
                                                                              else []),
              _predicted(r.predicted_vs_ar, r.measured_vs_ar), *_measured(r.measured_vs_ar)[:1],
              (r.measured_vs_ar.order if r.measured_vs_ar else "-")] for r in v.rows]
    if v.batch == 1:
        head = f"== batch 1: {v.units} paired units (prompts) =="
    elif refilled:
        head = (f"== batch {v.batch}, refilled batch: {v.units} paired units (the prompts of one queue served by "
                f"{v.batch} slots, a finished row's slot refilled at the next cycle) ==")
    else:
        head = f"== batch {v.batch}, static batch: {v.units} paired units (windows of {v.batch} prompts) =="
    per_unit = "per-prompt tok/s of its share of the cycle time" if refilled else "per-unit tok/s of cycle time"
    lines = [head, "", "acceptance (each shape its own decode)",
             text_table(["shape", "family", "fwd/token", "tau", "tok/fwd", "nodes", f"x {CHAIN}",
                         *(["rows/cycle"] if refilled else [])], acc), "",
             "cost per step (median ms over steps, first step of each decode left out)",
             text_table(["shape", *groups, f"x {CHAIN}", "steps"], cost), "",
             f"speedup (predicted = tok/fwd gain x step cost ratio; measured = paired {per_unit})",
             text_table(["shape", f"pred x {CHAIN}", f"meas x {CHAIN}", "IQR", "min", "p W/sign",
                         f"order (p<{ALPHA:g}, uncorrected)", *([f"queue x {CHAIN}"] if refilled else []),
                         "pred x AR", "meas x AR", f"order vs AR (p<{ALPHA:g}, uncorrected)"], speed),
             ""]
    if v.summary:
        lines.append(f"summary: {v.summary}")
    if v.verdict:
        lines.append(f"DDTree vs {CHAIN}: {v.verdict}")
    if v.decides:
        lines.append(f"  {v.decides}")
    if v.best_budget:
        best = f"best budget at batch {v.batch}: {v.best_budget} (measured median); predicted best: {v.predicted_best}"
        if v.best_vs_runner_up is not None:
            b = v.best_vs_runner_up
            best += (f"; vs runner-up {b.baseline}: {b.median:.3f}x, p={b.wilcoxon_p:.2g} "
                     f"({'separated' if b.significant else 'not separated'}, {UNCORRECTED})")
        lines.append(f"  {best}")
    if v.fastest:
        lines.append(f"fastest: {v.fastest}")
    if v.versus_best:
        baseline = v.versus_best[0].baseline
        lines.append(f"calibrated policies against the best DDTree budget, {baseline} (paired per unit):")
        for c in v.versus_best:
            lines.append(f"  {c.line}")
            if c.explanation:
                lines.append(f"    {c.explanation}")
    elif v.versus_best_note:
        lines.append(v.versus_best_note)
    for f in v.lossless:
        lines.append(f"  LOSSLESS CHECK FAILED: {f}")
    return "\n".join(lines)


def counterfactual_table(rows: list) -> str:
    body = [[r["label"], f"{r['end_to_end_tau']:.2f}", f"{r['counterfactual_tau']:.2f}",
             signed(100 * r['end_to_end_gain'], 1), signed(100 * r['counterfactual_gain'], 1),
             signed(r['bias_points'], 1, "")] for r in rows]
    return ("counterfactual from one trace (teaching row: the chain's trace replayed at budget N) vs the shape's "
            "own decode, batch 1\n" + text_table(["shape", "tau e2e", "tau from trace", "gain e2e", "gain from trace",
                                                   "bias (points)"], body))


def summary(res) -> list[str]:
    """The answer first: per batch size (its verdict's batch: the refilled one where measured), the fastest
    policy, AR included, against the runner-up, and what decides."""
    lines = [res.headline(b).summary for b in res.batches]
    if not any(lines):
        return []
    return ["summary (per batch size, the fastest policy measured against the runner-up, paired per unit):",
            *(f"  {x}" for x in lines if x)]


def render(res) -> str:
    st = res.settings
    mode = "greedy" if not st["temperature"] else f"temperature {st['temperature']:g}, seed {st['seed']}"
    out = [f"pays-off: {st['target']}, {st['prompts']} prompts, {st['max_new_tokens']} new tokens, {mode}, "
           f"{st['repeats']} repeat(s), {st['device']}, drafter block {st['block_size']}"]
    out += [f"note: {n}" for n in st.get("notes", [])]
    out += summary(res)
    out.append("")
    for b, v in res.batches.items():
        if res.sizing is not None:
            out += [res.sizing.line(b, v.rows), ""]
        out += [batch_tables(v), ""]
        if b in res.refilled:
            out += [batch_tables(res.refilled[b]), ""]
        if b in res.verdict_mode:
            mode = res.verdict_mode[b]
            out += [f"verdict mode at batch {b}: the {mode['mode']} batch's verdict is this batch size's; "
                    f"{mode['why']}", ""]
    if res.branching is not None:
        out += ["why: the target's token among the drafter's candidates (DFlash traces, untimed pass)",
                str(res.branching), res.branching.table(depths=8), ""]
    if res.counterfactual:
        out += [counterfactual_table(res.counterfactual), ""]
    if res.spine_siblings_90 is not None:
        out.append(f"Spine({res.spine_siblings_90}) reaches 90% of the best tree's tokens-per-forward gain over "
                   f"{CHAIN} (batch 1, end to end)")
    out += res.not_shown
    out.append(legend([
        ("fwd/token", "target forwards per committed token, counted from the cycles (every row of a batch)"),
        ("tau", "accepted + bonus per row and cycle"), ("tok/fwd", "tokens committed per target forward"),
        ("nodes", "nodes verified per row and cycle, the root included (the verify's width)"),
        ("draft .. host", "median ms per step of each stage (host = building the record: host reads, and the "
                          "rest of the step); on a loaded machine they need not add up to total, the median step; "
                          "'-': a stage the shape does not run (AR drafts nothing and builds no tree)"),
        ("pred", "predicted speedup: tok/fwd gain x step time ratio; 'missed': on the other side of 1 from the "
                 "measured median and outside its IQR"),
        ("meas", "median of the per-unit ratios of tok/s (cycle time); IQR and min beside it; a refilled "
                 "batch's unit is a prompt, its time its share of each cycle it ran in (the cycle's time over its "
                 "rows)"),
        ("queue", "refilled batch: the whole queue's tokens over its cycle time, over DFlash's (what an engine "
                  "reports as throughput)"),
        ("rows/cycle", "refilled batch: live rows per cycle (at most the batch size; fewer as the queue drains)"),
        ("p W/sign", "Wilcoxon signed-rank / sign test p-values (scipy.stats)"),
        ("order", f"each row against DFlash (or AR) on its own: an order where {UNCORRECTED}; the verdict and "
                  "fastest lines try several at once and say their Bonferroni threshold")]))
    return "\n".join(out)
