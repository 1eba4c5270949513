"""Does DDTree pay off on this pair, batch and device, and what decides? (``wb.pays_off``, ``pays-off``)

    res = wb.pays_off(engine, prompts, batch=(1, 8))      # every shape its own decode, interleaved per unit
    print(res)                                            # acceptance, cost, predicted vs measured, verdicts
    res.batches[8].verdict, res.batches[8].decides

Three things are measured apart: acceptance (target forwards counted from the cycles, per shape, each shape
its own decode), per-step cost (the engine's stage times, medians over steps) and the speedup (paired per
prompt at batch 1, per window of prompts at batch B; Wilcoxon and sign tests from scipy). Their product,
acceptance gain x per-step cost ratio, is the predicted speedup shown beside the measured one. From an
untimed DFlash pass (greedy only): the branching rates (``wb.analysis.branching``) and the single-trace
counterfactual of each DDTree budget with its bias against the end-to-end figure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from workbench.payoff.measure import decode_unit, lossless_failures, run_sweep
from workbench.payoff.shapes import (check_batch_fits, check_prompts, default_shapes, parse_batches, shapes_of)
from workbench.payoff.tables import render
from workbench.payoff.verdict import BatchVerdict, analyse, what_decides

DEFAULT_MAX_NEW_TOKENS = 64


@dataclass
class PaysOff:
    """The answer for one pair, prompt set and sampling setting: per batch size a ``BatchVerdict``; at
    batch 1 and greedy, the branching rates and the counterfactual rows."""

    settings: dict
    batches: dict  # batch size -> BatchVerdict
    branching: object | None = None  # workbench.analysis.branching.Branching (greedy only)
    counterfactual: list = field(default_factory=list)  # {label, end_to_end_tau, counterfactual_tau, ...}
    spine_siblings_90: int | None = None  # fewest siblings reaching 90% of the best tree's gain (batch 1)

    def __str__(self) -> str:
        return render(self)

    def to_dict(self) -> dict:
        return {"settings": self.settings,
                "batches": {str(b): {"units": v.units, "verdict": v.verdict, "decides": v.decides,
                                     "best_budget": v.best_budget, "predicted_best": v.predicted_best,
                                     "best_vs_runner_up": v.best_vs_runner_up.to_dict() if v.best_vs_runner_up
                                     else None, "lossless_failures": v.lossless,
                                     "shapes": [r.to_dict() for r in v.rows]}
                            for b, v in self.batches.items()},
                "branching": self.branching.to_dict() if self.branching is not None else None,
                "counterfactual": self.counterfactual, "spine_siblings_90": self.spine_siblings_90}


def _prompt_texts(prompts) -> tuple[list[str], list[str]]:
    """[{id, prompt}] or [str] or a split name ('long', 'short') -> (texts, ids)."""
    from workbench.bench.prompts import SPLITS, eval_prompts

    if prompts is None or (isinstance(prompts, str) and prompts in SPLITS):
        items = eval_prompts(prompts or "long")
    elif isinstance(prompts, str):
        raise ValueError(f"prompts={prompts!r}: give a list of prompts or a split name ({', '.join(SPLITS)})")
    else:
        items = [p if isinstance(p, dict) else {"id": f"prompt-{i}", "prompt": p} for i, p in enumerate(prompts)]
    for i, p in enumerate(items):
        if not isinstance(p.get("prompt"), str) or not p["prompt"]:
            raise ValueError(f"prompts[{i}] is not a non-empty prompt text")
    return [p["prompt"] for p in items], [str(p.get("id", i)) for i, p in enumerate(items)]


def counterfactual_rows(traces, verdict: BatchVerdict, chain: str = "DFlash") -> list[dict]:
    """Per DDTree(N) at batch 1: what the chain's trace says N nodes would have accepted (one trace, every
    cycle replayed at budget N) beside what DDTree(N)'s own decode accepted, and the gain's bias."""
    from workbench.analysis.budget import budget_needed

    need = budget_needed(traces)
    cycles = [c for t in traces for c in t.cycles]
    chain_tau = sum(c.accept_length for c in cycles) / len(cycles)
    out = []
    for r in verdict.rows:
        if r.family != "tree":
            continue
        budget = int(r.label[len("DDTree("):-1])
        if budget > need.max_budget:
            continue
        cf = need.tau_at(budget)
        e2e_gain, cf_gain = r.tau / verdict.row(chain).tau - 1, cf / chain_tau - 1
        out.append({"label": r.label, "end_to_end_tau": r.tau, "counterfactual_tau": cf, "chain_tau": chain_tau,
                    "end_to_end_gain": e2e_gain, "counterfactual_gain": cf_gain, "bias_points": cf_gain - e2e_gain})
    return out


def pays_off(engine=None, prompts=None, batch=(1, 8), policies=None, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
             temperature: float = 0.0, seed: int = 0, repeats: int = 1, warmup: bool = True,
             progress=None) -> PaysOff:
    """Measure whether DDTree pays off (see the module docstring). Every input is checked before any decode.

    engine: a loaded ``wb.Engine`` (default: the embedded dense pair); prompts: a list (texts or {id, prompt}),
    or a split name 'long' / 'short' (default 'long'), at least 10; batch: sizes, e.g. (1, 8) or '1,8';
    policies: the shapes (default: AR, DFlash, the chain cut to 4 and 8, Spine(1, 2, 4), DDTree(4 ... 64) as the
    drafter's block allows; AR and DFlash are always added); repeats: timed decodes per unit and shape
    (medians kept)."""
    from workbench.bench.runs import positive_ints
    from workbench.engine import validate
    from workbench.engine.core import load
    from workbench.engine.policies import DFlash

    texts, ids = _prompt_texts(prompts)
    check_prompts(len(texts))
    batches = parse_batches(batch)
    validate.temperature(temperature), validate.seed(seed)
    positive_ints(max_new_tokens=max_new_tokens, repeats=repeats)
    engine = load() if engine is None else engine
    m = engine.models
    slots, vocab = m.block_size - 1, int(m.target.config.get_text_config().vocab_size)
    shapes = default_shapes(slots, vocab) if policies is None else shapes_of(policies, slots, vocab)
    longest = max(len(engine.encode(t).ids) for t in texts)
    if longest + max_new_tokens >= m.max_positions:
        raise ValueError(f"the longest prompt is {longest} tokens; with max_new_tokens={max_new_tokens} it passes "
                         f"the target's {m.max_positions} positions: fewer new tokens or shorter prompts")
    from workbench.engine.runner import static_nodes

    widest = max(static_nodes(s.policy, m.block_size) for s in shapes)
    for b in batches:
        check_batch_fits(engine, b, longest + max_new_tokens, widest)

    from tqdm.auto import tqdm

    greedy = temperature == 0.0
    total = sum((len(shapes) if warmup else 0) + len(texts) * repeats * len(shapes) for _ in batches)
    bar = tqdm(total=total + (len(texts) if greedy else 0), desc="pays-off", unit="decode", leave=False,
               disable=(None if progress is None else not progress))
    res = PaysOff(settings={"prompts": len(texts), "prompt_ids": ids, "batch": list(batches),
                            "shapes": [s.label for s in shapes], "max_new_tokens": max_new_tokens,
                            "temperature": temperature, "seed": seed, "repeats": repeats,
                            "device": str(engine.device), "target": str(m.target_dir),
                            "block_size": m.block_size}, batches={})
    try:
        for b in batches:
            sw = run_sweep(engine, shapes, texts, b, max_new_tokens, temperature, seed, repeats, warmup, bar)
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
            from workbench.analysis.branching import branching, siblings_to_share

            res.branching = branching(traces)
            first = res.batches[batches[0]]
            if batches[0] == 1:
                res.counterfactual = counterfactual_rows(traces, first)
            spines = {int(r.label[len("Spine("):-1]): r.tokens_per_forward for r in first.rows if r.family == "spine"}
            trees = [r for r in first.rows if r.family == "tree"]
            if spines and trees and "DFlash" in [r.label for r in first.rows]:
                res.spine_siblings_90 = siblings_to_share(spines, first.row("DFlash").tokens_per_forward,
                                                          max(r.tokens_per_forward for r in trees))
    finally:
        bar.close()
    return res


__all__ = ["PaysOff", "pays_off", "what_decides"]
