"""Does DDTree pay off on this pair, batch and device, and what decides? (``wb.pays_off``, ``pays-off``)

    res = wb.pays_off(engine, prompts, batch=(1, 8))      # every shape its own decode, interleaved per unit
    print(res)                                            # acceptance, cost, predicted vs measured, verdicts
    res.headline(8).verdict, res.headline(8).decides      # batch 8's verdict: the refilled batch's
    res.batches[8], res.refilled[8]                       # the static batch and the refilled one
    res.headline(8).fastest                               # the fastest policy measured, AR included
    res.headline(8).versus_best                           # each calibrated policy against the best DDTree budget

Three things are measured apart: acceptance (target forwards counted from the cycles, per shape, each shape
its own decode), per-step cost (the engine's stage times, medians over steps) and the speedup (paired per
prompt at batch 1; at batch B per window of B prompts in a static batch, and per prompt of one queue served
by B refilled slots (``workbench.payoff.refill``); Wilcoxon and sign tests from scipy). Their product,
acceptance gain x per-step cost ratio, is the predicted speedup shown beside the measured one. In the default
set each calibrated policy is sized per batch size on calibration prompts (``workbench.payoff.sizing``).
From an untimed DFlash pass (greedy only): the branching rates (``wb.analysis.branching``) and the
single-trace counterfactual of each DDTree budget with its bias against the end-to-end figure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from workbench.payoff.inputs import MEASURED_NEW_TOKENS, PaysOffInputError, check_inputs, fit_to_engine
from workbench.payoff.measure import decode_unit, lossless_failures, run_sweep
from workbench.payoff.strict_json import strict_json
from workbench.payoff.tables import render
from workbench.payoff.verdict import BatchVerdict, analyse, what_decides

# Why the verdict at B > 1 is the refilled batch's (printed with it, and in the JSON's verdict_mode).
REFILLED_WHY = ("serving engines batch this way: SGLang and vLLM refill a finished row's slot with the next "
                "waiting request at the next cycle, so a row that ends early leaves no slot idle; the static batch "
                "runs each window until its slowest row ends, a tail no deployed engine has, and is shown beside it")


@dataclass
class PaysOff:
    """The answer for one pair, prompt set and sampling setting: per batch size a ``BatchVerdict`` of the
    static batch (``batches``) and, at B > 1, of the refilled batch (``refilled``), and which of them gives
    that batch size's verdict (``verdict_mode``, ``headline``); at batch 1 and greedy, the branching rates
    and the counterfactual rows."""

    settings: dict
    batches: dict  # batch size -> BatchVerdict of the static batch (at 1: one prompt per unit), ascending
    refilled: dict = field(default_factory=dict)  # batch size (> 1) -> BatchVerdict of the refilled batch
    verdict_mode: dict = field(default_factory=dict)  # batch size (> 1) -> {"mode": ..., "why": ...}
    sizing: object | None = None  # workbench.payoff.sizing.Sizing: the calibrated policies' sizes per batch
    branching: object | None = None  # workbench.analysis.branching.Branching (greedy only)
    counterfactual: list = field(default_factory=list)  # {label, end_to_end_tau, counterfactual_tau, ...}
    spine_siblings_90: int | None = None  # fewest siblings reaching 90% of the best tree's gain (batch 1)
    not_shown: list = field(default_factory=list)  # one line per part left out, saying why

    def headline(self, batch: int) -> BatchVerdict:
        """The BatchVerdict whose verdict is this batch size's: the refilled batch's where it was measured."""
        mode = self.verdict_mode.get(batch, {}).get("mode", "static")
        return self.refilled[batch] if mode == "refilled" else self.batches[batch]

    def __str__(self) -> str:
        return render(self)

    def to_dict(self) -> dict:
        """Strict JSON (no NaN or infinity: null, with a sibling '<key>_note' saying why). Gains and speedups
        are ratios (0.126 = +12.6%); ``bias_points`` is in percentage points, as the text prints it."""
        return strict_json({
            "summary": {str(b): self.headline(b).summary for b in self.batches},  # the answer first, per batch size
            "settings": self.settings,
            "batches": {str(b): verdict_dict(v) for b, v in self.batches.items()},
            "refilled": {str(b): verdict_dict(v) for b, v in self.refilled.items()},
            "verdict_mode": {str(b): v for b, v in self.verdict_mode.items()},
            "sizing": self.sizing.to_dict() if self.sizing is not None else None,
            "branching": self.branching.to_dict() if self.branching is not None else None,
            "counterfactual": self.counterfactual, "spine_siblings_90": self.spine_siblings_90,
            "not_shown": self.not_shown})


def verdict_dict(v: BatchVerdict) -> dict:
    return {"mode": v.mode, "units": v.units, "summary": v.summary, "verdict": v.verdict, "decides": v.decides,
            "fastest": v.fastest,
            "best_budget": v.best_budget, "predicted_best": v.predicted_best,
            "best_vs_runner_up": v.best_vs_runner_up.to_dict() if v.best_vs_runner_up else None,
            "versus_best": [c.to_dict() for c in v.versus_best], "versus_best_note": v.versus_best_note or None,
            "lossless_failures": v.lossless, "shapes": [r.to_dict() for r in v.rows]}


def counterfactual_rows(traces, verdict: BatchVerdict, shapes, chain: str = "DFlash") -> tuple[list[dict], list[str]]:
    """Per DDTree(N) at batch 1: what the chain's trace says N nodes would have accepted (one trace, every
    cycle replayed at budget N) beside what DDTree(N)'s own decode accepted, and the gain's bias (percentage
    points). -> (rows, one line per tree left out and why)."""
    from workbench.analysis.budget import budget_needed

    need = budget_needed(traces)
    cycles = [c for t in traces for c in t.cycles]
    chain_tau = sum(c.accept_length for c in cycles) / len(cycles)
    policy = {s.label: s.policy for s in shapes}
    out, left = [], []
    for r in verdict.rows:
        if r.family != "tree":
            continue
        p = policy[r.label]
        if p.width is not None:  # the counterfactual ranks a full-width tree: it says nothing of a capped one
            left.append(f"{r.label}: no counterfactual row (the single-trace counterfactual is of full-width "
                        f"DDTree(N) only)")
            continue
        if p.budget > need.max_budget:
            left.append(f"{r.label}: no counterfactual row (the trace ranks candidates up to {need.max_budget})")
            continue
        cf = need.tau_at(p.budget)
        e2e_gain, cf_gain = r.tau / verdict.row(chain).tau - 1, cf / chain_tau - 1
        out.append({"label": r.label, "end_to_end_tau": r.tau, "counterfactual_tau": cf, "chain_tau": chain_tau,
                    "end_to_end_gain": e2e_gain, "counterfactual_gain": cf_gain,
                    "bias_points": 100 * (cf_gain - e2e_gain)})
    if not any(r.family == "tree" for r in verdict.rows):
        left.append("no counterfactual table: it is of DDTree budgets, and none was among the policies; add ddtree:N")
    return out, left


def spine_share(first: BatchVerdict, shapes) -> tuple[int | None, list[str]]:
    """The fewest siblings whose spine reaches 90% of the best tree's tokens-per-forward gain over DFlash,
    or a line saying why there is no answer (no spine, no tree, a tree that gains nothing, none reaches)."""
    from workbench.analysis.branching import siblings_to_share

    policy = {s.label: s.policy for s in shapes}
    spines = {policy[r.label].siblings: r.tokens_per_forward for r in first.rows if r.family == "spine"}
    trees = [r for r in first.rows if r.family == "tree"]
    if not spines:
        return None, []
    if not trees:
        return None, ["no spine comparison: it measures a spine against the best DDTree's tokens-per-forward "
                      "gain, and no DDTree budget was among the policies; add ddtree:N"]
    chain, best = first.row("DFlash").tokens_per_forward, max(r.tokens_per_forward for r in trees)
    if best <= chain:
        return None, [f"no spine comparison: the best DDTree gains nothing over DFlash in tokens per forward "
                      f"({best:.2f} vs {chain:.2f}, batch 1), so there is no gain to reach 90% of"]
    k = siblings_to_share(spines, chain, best)
    if k is None:
        return None, ["no measured spine reaches 90% of the best tree's tokens-per-forward gain (batch 1)"]
    return k, []


def pays_off(engine=None, prompts=None, batch=(1, 8), policies=None, max_new_tokens: int = MEASURED_NEW_TOKENS,
             temperature: float = 0.0, seed: int = 0, repeats: int = 1, warmup: bool = True,
             progress=None) -> PaysOff:
    """Measure whether DDTree pays off (see the module docstring). Every input is checked before any model
    loads or decodes (``workbench.payoff.inputs``); bad input raises ``PaysOffInputError`` (a ValueError).

    engine: a loaded ``wb.Engine`` (default: the embedded dense pair); prompts: a list (texts or {id, prompt}),
    or a split name 'long' / 'short' (default 'long'), at least 10 distinct (copies are left out, with a note);
    batch: a size or sizes, e.g. 8, (1, 8) or '1,8', each at most the number of prompts; at B > 1 both the
    static batch and the refilled one (``workbench.payoff.refill``); policies: the shapes, as policies or their
    spellings ('ddtree:8', 'dflash,ddtree:8', ['spine:2', wb.DDTree(16)]) (default: AR, DFlash, the chain cut
    to 4 and 8, Spine(1, 2, 4), DDTree(4 ... 64) as the drafter's block allows, and one size of each calibrated
    policy per batch size, chosen on calibration prompts (``workbench.payoff.sizing``), where a calibration was
    made on the pair (else left out, with a note); AR and DFlash are always added; a named calibrated policy
    whose calibration was made on another pair is refused before any decode); max_new_tokens: at least 3;
    repeats: timed decodes per unit and shape (medians kept)."""
    from workbench.engine.core import load
    from workbench.engine.policies import DFlash
    from workbench.models.identity import pair_identity
    from workbench.payoff.inputs import refill_refusal
    from workbench.payoff.sizing import SIZED_FAMILIES, SIZING_PROMPTS, size_policies, sized_shapes

    inp = check_inputs(prompts, batch, policies, max_new_tokens, temperature, seed, repeats)
    engine = load() if engine is None else engine
    shapes = fit_to_engine(inp, engine)
    texts, batches, m = inp.texts, inp.batches, engine.models
    vocab = int(m.target.config.get_text_config().vocab_size)
    refused = {b: refill_refusal(inp, engine, shapes, b) for b in batches if b > 1}

    from tqdm.auto import tqdm

    greedy = inp.temperature == 0.0
    sizes_here = inp.policies is None and any(s.family in SIZED_FAMILIES for s in shapes)
    total = sum(len(shapes) * ((1 if warmup else 0) + len(texts) * repeats
                               + ((1 if warmup else 0) + repeats if b > 1 and not refused[b] else 0))
                for b in batches)
    total += (len(texts) if greedy else 0) + (SIZING_PROMPTS if sizes_here else 0)
    bar = tqdm(total=total, desc="pays-off", unit="decode", leave=False,
               disable=(None if progress is None else not progress))
    res = PaysOff(settings={"prompts": len(texts), "prompt_ids": inp.ids, "batch": list(batches),
                            "shapes": [s.label for s in shapes], "max_new_tokens": max_new_tokens,
                            "temperature": inp.temperature, "seed": seed, "repeats": repeats,
                            "device": str(engine.device), "target": str(m.target_dir),
                            "block_size": m.block_size, "notes": list(inp.notes)}, batches={})
    try:
        sizing = None
        if sizes_here:  # the default set: each calibrated policy at the size chosen for each batch
            bar.set_postfix_str("sizing the calibrated policies on calibration prompts", refresh=False)
            sizing = size_policies(engine, shapes, batches, texts, progress=lambda i, n: bar.update(1))
        res.sizing = sizing
        by_batch = {b: sized_shapes(shapes, sizing, b, pair_identity(m)) for b in batches}
        if sizing is not None:
            res.settings["notes"] += sizing.notes
            res.settings["shapes"] = list(dict.fromkeys(s.label for b in batches for s in by_batch[b]))
            res.settings["shapes_by_batch"] = {str(b): [s.label for s in by_batch[b]] for b in batches}
        for b in batches:
            measure_batch(res, engine, by_batch[b], inp, b, warmup, bar, refused.get(b, ""))
        if greedy:
            branching_pass(res, engine, by_batch[1 if 1 in batches else batches[0]], texts, max_new_tokens, seed,
                           vocab, bar, DFlash())
    finally:
        bar.close()
    return res


def measure_batch(res: PaysOff, engine, shapes, inp, b: int, warmup: bool, bar, refused: str) -> None:
    """Batch size ``b``: the static sweep, and at b > 1 the refilled one beside it, with the verdict's mode."""
    from workbench.payoff.refill import run_refilled_sweep

    texts, greedy = inp.texts, inp.temperature == 0.0
    sw = run_sweep(engine, shapes, texts, b, inp.max_new_tokens, inp.temperature, inp.seed, inp.repeats, warmup, bar)
    v = res.batches[b] = analyse(sw, shapes)
    if greedy:
        v.lossless = lossless_failures(sw)
    if b == 1:
        return
    if refused:
        res.verdict_mode[b] = {"mode": "static", "why": f"the refilled batch was not measured: {refused}"}
        res.not_shown.append(f"at batch {b} no refilled batch: {refused}")
        return
    rsw = run_refilled_sweep(engine, shapes, texts, b, inp.max_new_tokens, inp.temperature, inp.seed, inp.repeats,
                             warmup, bar)
    rv = res.refilled[b] = analyse(rsw, shapes)
    if greedy:
        rv.lossless = lossless_failures(rsw)
    res.verdict_mode[b] = {"mode": "refilled", "why": REFILLED_WHY}


def branching_pass(res: PaysOff, engine, shapes, texts, max_new_tokens: int, seed: int, vocab: int, bar,
                   chain) -> None:
    """Untimed: the chain's traces with enough candidates recorded for every budget, the branching rates, and
    (with batch 1 among the sizes) the counterfactual rows and the spine's share."""
    from workbench.analysis.branching import branching

    budgets = [s.policy.budget for s in shapes if s.family == "tree"] or [8]
    traces = []
    for t in texts:
        bar.set_postfix_str("branching traces", refresh=False)
        traces += decode_unit(engine, chain, [t], max_new_tokens, 0.0, seed,
                              record_topk=min(max(budgets), vocab))[1]
        bar.update(1)
    res.branching = branching(traces)
    # The counterfactual and the spine's share compare with one decode per prompt: batch 1's, wherever it
    # stands in the list (at batch B a forward's tokens are set by the slowest row).
    if 1 in res.batches:
        res.counterfactual, left = counterfactual_rows(traces, res.batches[1], shapes)
        res.spine_siblings_90, why = spine_share(res.batches[1], shapes)
        res.not_shown += left + why
    else:
        res.not_shown.append("no counterfactual table or spine comparison: both compare with batch 1's "
                             "decodes (one per prompt); add 1 to the batch sizes")


__all__ = ["PaysOff", "PaysOffInputError", "check_inputs", "pays_off", "what_decides"]
