"""Does DDTree pay off on this pair, batch and device, and what decides? (``wb.pays_off``, ``pays-off``)

    res = wb.pays_off(engine, prompts, batch=(1, 8))      # every shape its own decode, interleaved per unit
    print(res)                                            # acceptance, cost, predicted vs measured, verdicts
    res.batches[8].verdict, res.batches[8].decides        # DDTree's budgets against DFlash, and what decides
    res.batches[8].fastest                                # the fastest policy measured, AR included
    res.batches[8].versus_best                            # each calibrated policy against the best DDTree budget

Three things are measured apart: acceptance (target forwards counted from the cycles, per shape, each shape
its own decode), per-step cost (the engine's stage times, medians over steps) and the speedup (paired per
prompt at batch 1, per window of prompts at batch B; Wilcoxon and sign tests from scipy). Their product,
acceptance gain x per-step cost ratio, is the predicted speedup shown beside the measured one. From an
untimed DFlash pass (greedy only): the branching rates (``wb.analysis.branching``) and the single-trace
counterfactual of each DDTree budget with its bias against the end-to-end figure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from workbench.payoff.inputs import MEASURED_NEW_TOKENS, PaysOffInputError, check_inputs, fit_to_engine
from workbench.payoff.measure import decode_unit, lossless_failures, run_sweep
from workbench.payoff.strict_json import strict_json
from workbench.payoff.tables import render
from workbench.payoff.verdict import BatchVerdict, analyse, what_decides

@dataclass
class PaysOff:
    """The answer for one pair, prompt set and sampling setting: per batch size a ``BatchVerdict``; at
    batch 1 and greedy, the branching rates and the counterfactual rows."""

    settings: dict
    batches: dict  # batch size -> BatchVerdict, ascending
    branching: object | None = None  # workbench.analysis.branching.Branching (greedy only)
    counterfactual: list = field(default_factory=list)  # {label, end_to_end_tau, counterfactual_tau, ...}
    spine_siblings_90: int | None = None  # fewest siblings reaching 90% of the best tree's gain (batch 1)
    not_shown: list = field(default_factory=list)  # one line per part left out, saying why

    def __str__(self) -> str:
        return render(self)

    def to_dict(self) -> dict:
        """Strict JSON (no NaN or infinity: null, with a sibling '<key>_note' saying why). Gains and speedups
        are ratios (0.126 = +12.6%); ``bias_points`` is in percentage points, as the text prints it."""
        return strict_json({
            "settings": self.settings,
            "batches": {str(b): {"units": v.units, "verdict": v.verdict, "decides": v.decides, "fastest": v.fastest,
                                 "best_budget": v.best_budget, "predicted_best": v.predicted_best,
                                 "best_vs_runner_up": v.best_vs_runner_up.to_dict() if v.best_vs_runner_up
                                 else None, "versus_best": [c.to_dict() for c in v.versus_best],
                                 "versus_best_note": v.versus_best_note or None, "lossless_failures": v.lossless,
                                 "shapes": [r.to_dict() for r in v.rows]}
                        for b, v in self.batches.items()},
            "branching": self.branching.to_dict() if self.branching is not None else None,
            "counterfactual": self.counterfactual, "spine_siblings_90": self.spine_siblings_90,
            "not_shown": self.not_shown})


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
    batch: a size or sizes, e.g. 8, (1, 8) or '1,8', each at most the number of prompts; policies: the shapes,
    as policies or their spellings ('ddtree:8', 'dflash,ddtree:8', ['spine:2', wb.DDTree(16)]) (default: AR,
    DFlash, the chain cut to 4 and 8, Spine(1, 2, 4), DDTree(4 ... 64) as the drafter's block allows, and one
    size of each calibrated policy, PathTree(16), CostTree(64), CutTree(16), PairTree(16), PairChain(8), where
    a calibration was made on the pair (else left out, with a note); AR and DFlash are always added; a named
    calibrated policy whose calibration was made on another pair is refused before any decode);
    max_new_tokens: at least 3; repeats: timed decodes per unit and shape (medians kept)."""
    from workbench.engine.core import load
    from workbench.engine.policies import DFlash

    inp = check_inputs(prompts, batch, policies, max_new_tokens, temperature, seed, repeats)
    engine = load() if engine is None else engine
    shapes = fit_to_engine(inp, engine)
    texts, batches, m = inp.texts, inp.batches, engine.models
    vocab = int(m.target.config.get_text_config().vocab_size)

    from tqdm.auto import tqdm

    greedy = inp.temperature == 0.0
    total = sum((len(shapes) if warmup else 0) + len(texts) * repeats * len(shapes) for _ in batches)
    bar = tqdm(total=total + (len(texts) if greedy else 0), desc="pays-off", unit="decode", leave=False,
               disable=(None if progress is None else not progress))
    res = PaysOff(settings={"prompts": len(texts), "prompt_ids": inp.ids, "batch": list(batches),
                            "shapes": [s.label for s in shapes], "max_new_tokens": max_new_tokens,
                            "temperature": inp.temperature, "seed": seed, "repeats": repeats,
                            "device": str(engine.device), "target": str(m.target_dir),
                            "block_size": m.block_size, "notes": list(inp.notes)}, batches={})
    try:
        for b in batches:
            sw = run_sweep(engine, shapes, texts, b, max_new_tokens, inp.temperature, seed, repeats, warmup, bar)
            v = res.batches[b] = analyse(sw, shapes)
            if greedy:
                v.lossless = lossless_failures(sw)
        if greedy:  # untimed: the chain's traces with enough candidates recorded for every budget
            budgets = [s.policy.budget for s in shapes if s.family == "tree"] or [8]
            traces = []
            for t in texts:
                bar.set_postfix_str("branching traces", refresh=False)
                traces += decode_unit(engine, DFlash(), [t], max_new_tokens, 0.0, seed,
                                      record_topk=min(max(budgets), vocab))[1]
                bar.update(1)
            from workbench.analysis.branching import branching

            res.branching = branching(traces)
            # The counterfactual and the spine's share compare with one decode per prompt: batch 1's, wherever
            # it stands in the list (at batch B a forward's tokens are set by the slowest row).
            if 1 in res.batches:
                res.counterfactual, left = counterfactual_rows(traces, res.batches[1], shapes)
                res.spine_siblings_90, why = spine_share(res.batches[1], shapes)
                res.not_shown += left + why
            else:
                res.not_shown.append("no counterfactual table or spine comparison: both compare with batch 1's "
                                     "decodes (one per prompt); add 1 to the batch sizes")
    finally:
        bar.close()
    return res


__all__ = ["PaysOff", "PaysOffInputError", "check_inputs", "pays_off", "what_decides"]
