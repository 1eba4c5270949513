"""One size of each calibrated policy per batch size, chosen on calibration prompts, never on a measured one.

Which size fits depends on the batch (the best DDTree budget falls from 8-16 at batch 1 to 4-8 at batch 8 in
``docs/pays-off.md``), so the default set does not hold each calibrated policy at one fixed size: per batch size
B it holds the size chosen the way the calibration chooses CutTree's threshold (``workbench.calibrate.choose``):

- greedy decodes of calibration prompts (``workbench.calibrate.prompts``: training-corpus text, kept apart
  from every evaluation prompt; any that overlaps a prompt this run measures is left out too) record the
  drafter's top-K per slot and the target's ranks among them (``workbench.calibrate.collect``);
- each candidate size's tree is rebuilt on every recorded cycle, and the target's ranks say what it accepts;
- cycles dealt into batches of B rows cost the pair's step-cost table (its calibration's) at their widest
  row; the size with the most committed tokens per predicted ms is chosen (the smaller on a tie).

A replay carries the single-trace counterfactual's bias: it chooses a size, and pays-off measures the speed.
PairChain is not sized: it verifies one chain of the drafter's slots at every width, so no batch size changes
what its verify costs and the step-cost table cannot tell its widths apart; it keeps the width its head's
beta was chosen on.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from workbench.payoff.inputs import PaysOffInputError

SIZES = (4, 8, 16, 32, 64)  # the candidate budgets, those the drafter's block fills (DDTree's default budgets)
SIZED_FAMILIES = ("path-tree", "cost-tree", "cut-tree", "pair-tree")
SIZING_PROMPTS = 32  # calibration prompts decoded to size the policies (the first of the calibration's own)
SIZING_NEW_TOKENS = 48
MIN_SIZING_PROMPTS = 8  # fewer left after the overlap check: refused


@dataclass
class Sizing:
    """The chosen size per batch size and family, and what chose it."""

    sizes: dict  # batch -> family -> budget
    figures: dict  # batch -> family -> {size: replayed tokens per predicted ms}
    prompts: int  # calibration prompts decoded
    cycles: int  # drafted cycles replayed
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"sizes": {str(b): v for b, v in self.sizes.items()},
                "tokens_per_ms": {str(b): {f: {str(n): r for n, r in v.items()} for f, v in fam.items()}
                                  for b, fam in self.figures.items()},
                "prompts": self.prompts, "cycles": self.cycles, "notes": self.notes}

    def line(self, batch: int, shapes) -> str:
        said = ", ".join(s.label for s in shapes if s.family in SIZED_FAMILIES)
        if not self.sizes.get(batch):
            return f"calibrated sizes at batch {batch}: {said} (the default sizes: nothing to size them with)"
        return (f"calibrated sizes at batch {batch}: {said} (the most replayed tokens per predicted ms at {batch} "
                f"row(s) over sizes {', '.join(map(str, SIZES))}, on {self.cycles} cycles of {self.prompts} "
                "calibration prompts, none of them measured here)")


def calibration_texts(measured: list[str], given: list[str] | None = None,
                      n: int = SIZING_PROMPTS) -> tuple[list[str], list[str]]:
    """The prompts the sizes are chosen on, and a note per left-out one: ``given`` (default: the first ``n``
    calibration prompts) less any that equals, lies inside or holds a measured prompt. Fewer than
    ``MIN_SIZING_PROMPTS`` left are refused."""
    from workbench.calibrate.prompts import calibration_prompts, overlaps

    texts = given if given is not None else [p["prompt"] for p in calibration_prompts(n)[0]]
    held = set(measured)
    kept = [t for t in texts if not overlaps(t, held)]
    notes = []
    if len(kept) < len(texts):
        notes.append(f"{len(texts) - len(kept)} calibration prompt(s) left out of the sizing: each equals, lies "
                     "inside or holds a prompt measured here (a size is chosen on prompts the run does not measure)")
    if len(kept) < MIN_SIZING_PROMPTS:
        raise PaysOffInputError(f"{len(kept)} calibration prompts are apart from the measured ones; sizing the "
                                f"calibrated policies needs {MIN_SIZING_PROMPTS}: measure other prompts, or name "
                                "the sizes with --policies")
    return kept, notes


def pair_replayed(cyc, head, beta: float, budget: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """PairTree(budget) rebuilt on every cycle: (node scores, indices of the accepted path's nodes) per cycle,
    as ``workbench.calibrate.choose.replayed`` gives for the path-conditioned tree."""
    from ddtree_kernels.path_tree import path_tree_heap, rank_class
    from workbench.calibrate.choose import accepted_path
    from workbench.engine.policies.pair_head import conditioned_increments

    out = []
    k = min(budget, cyc.K)
    for c in range(cyc.topv.shape[0]):
        D = int(np.isfinite(cyc.topv[c, :, 0]).sum())  # slots drafted this cycle
        if D == 0:
            out.append((np.zeros(0), np.zeros(0, dtype=np.int64)))
            continue
        topv = torch.from_numpy(cyc.topv[c : c + 1, :D, :k].astype(np.float32))  # [1, D, k]
        topi = torch.from_numpy(cyc.topi[c : c + 1, :D, :k])  # [1, D, k]
        root = torch.tensor([int(cyc.path[c, 0])])
        inc = conditioned_increments(head, topv, topi, root, beta)  # [1, D, k, k]
        t = path_tree_heap(inc, topi, root, budget, rank_class, 0)
        path = accepted_path(t.parents[0].tolist(), t.rank[0].tolist(), cyc.ranks[c], D)
        out.append((t.score[0, 1:].numpy(), np.array(path, dtype=np.int64)))
    return out


def replay_rates(cyc, cal, families: list[str], batches, sizes) -> dict:
    """batch -> family -> {size: replayed tokens per predicted ms} (``workbench.calibrate.choose.rate``)."""
    from workbench.calibrate.choose import rate, replayed
    from workbench.engine.policies.cost_tree import budget_for
    from workbench.engine.policies.cut_tree import kept_nodes

    cost = cal.step_cost()
    head, beta = cal.head() if "pair-tree" in families else (None, 0.0)
    out = {b: {f: {} for f in families} for b in batches}
    for n in sizes:
        path = replayed(cyc, cal.model, n, None) if set(families) - {"pair-tree"} else []
        pair = pair_replayed(cyc, head, beta, n) if "pair-tree" in families else []
        for b in batches:
            keep = {"path-tree": lambda t: [len(s) for s, _ in t],
                    "cut-tree": lambda t: [kept_nodes(s, cal.threshold("tree", b)) for s, _ in t],
                    "cost-tree": lambda t: [budget_for(s, b, cost) for s, _ in t],
                    "pair-tree": lambda t: [len(s) for s, _ in t]}
            for f in families:
                trees = pair if f == "pair-tree" else path
                out[b][f][n] = rate(trees, keep[f](trees), b, cost)["tokens_per_ms"]
    return out


def size_policies(engine, shapes, batches, measured: list[str], given: list[str] | None = None,
                  max_new_tokens: int = SIZING_NEW_TOKENS, progress=None) -> Sizing | None:
    """The sizes of the calibrated policies among ``shapes`` (bound to the pair) per batch size, chosen on
    calibration prompts (see the module's docstring); None when none is among them."""
    from workbench.calibrate.collect import collect

    mine = [s for s in shapes if s.family in SIZED_FAMILIES]
    if not mine:
        return None
    cal = mine[0].policy.calibration_data()  # one calibration per pair: every calibrated policy's
    if cal.cost is None:
        return Sizing({b: {} for b in batches}, {}, 0, 0, [
            f"calibrated policies at their default sizes: calibration {cal.path} holds no cost table to size them "
            "with (python -m workbench.calibrate --costs FILE)"])
    texts, notes = calibration_texts(measured, given)
    m = engine.models
    slots, vocab = m.block_size - 1, int(m.target.config.get_text_config().vocab_size)
    sizes = [n for n in SIZES if all(dataclasses.replace(s.policy, budget=n).capacity(slots, vocab) is None
                                     for s in mine)]
    cyc = collect(engine, texts, max_new_tokens, cal.width, progress)
    families = list(dict.fromkeys(s.family for s in mine))
    figures = replay_rates(cyc, cal, families, batches, sizes)
    chosen = {b: {f: max(sizes, key=lambda n: (figures[b][f][n], -n)) for f in families} for b in batches}
    return Sizing(chosen, figures, len(texts), int(cyc.topv.shape[0]), notes)


def sized_shapes(shapes, sizing: Sizing | None, batch: int, pair: dict) -> list:
    """``shapes`` with each sized calibrated policy at its size for ``batch``, bound to ``pair``."""
    if sizing is None:
        return list(shapes)
    out = []
    for s in shapes:
        n = sizing.sizes[batch].get(s.family)
        if n is not None and n != s.policy.budget:
            s = dataclasses.replace(s, policy=dataclasses.replace(s.policy, budget=n).for_pair(pair))
        out.append(s)
    return out
