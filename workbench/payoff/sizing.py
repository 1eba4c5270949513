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

CondTree scores a candidate from the drafter's hidden state, which a recorded cycle does not keep: it is replayed
on blocks rooted at random positions of the same decodes' continuations (any position a cycle could start at),
the drafter's states recomputed from the target's tokens as its head's training computes them
(``workbench.train.cond_data``), and costed the same way.

A replay carries the single-trace counterfactual's bias: it chooses a size, and pays-off measures the speed.
PairChain and CondChain are not sized: each verifies one chain of the drafter's slots at every width, so no
batch size changes what its verify costs and the step-cost table cannot tell its widths apart; each keeps its
default width (``workbench.payoff.tree_shapes.CALIBRATED``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from workbench.payoff.inputs import PaysOffInputError

SIZES = (4, 8, 16, 32, 64)  # the candidate budgets, those the drafter's block fills (DDTree's default budgets)
SIZED_FAMILIES = ("path-tree", "cost-tree", "cut-tree", "pair-tree", "cond-tree")
LEARNED = "cond-tree"  # the sized family replayed on recomputed blocks (its head reads the drafter's states)
COND_ANCHORS = 16  # blocks per calibration decode CondTree is replayed on (about as many as its drafted cycles)
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
    blocks: int = 0  # blocks of the decodes' continuations CondTree was replayed on

    def to_dict(self) -> dict:
        return {"sizes": {str(b): v for b, v in self.sizes.items()},
                "tokens_per_ms": {str(b): {f: {str(n): r for n, r in v.items()} for f, v in fam.items()}
                                  for b, fam in self.figures.items()},
                "prompts": self.prompts, "cycles": self.cycles, "blocks": self.blocks, "notes": self.notes}

    def line(self, batch: int, shapes) -> str:
        said = ", ".join(s.label for s in shapes if s.family in SIZED_FAMILIES)
        if not self.sizes.get(batch):
            return f"calibrated sizes at batch {batch}: {said} (the default sizes: nothing to size them with)"
        learned = f"; CondTree on {self.blocks} blocks of their continuations" if self.blocks else ""
        return (f"calibrated sizes at batch {batch}: {said} (the most replayed tokens per predicted ms at {batch} "
                f"row(s) over sizes {', '.join(map(str, SIZES))}, on {self.cycles} cycles of {self.prompts} "
                f"calibration prompts{learned}, none of them measured here)")


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


@torch.no_grad()
def cond_blocks(models, sequences, K: int, anchors: int = COND_ANCHORS, seed: int = 0):
    """Blocks rooted at ``anchors`` random positions (all, when fewer) of each decode's continuation, from the
    first generated token on (where the first cycle starts), with the drafter's states and top-``K`` per slot
    (``workbench.train.cond_data.Blocks``); None when no decode generated two tokens.

    sequences: [(prompt ids + generated ids, prompt length)] (``Cycles.sequences``)."""
    import random

    from workbench.train.cond_data import Blocks, sequence_blocks

    rng, parts = random.Random(seed), []
    dev = models.target.device
    for g, (ids, n) in enumerate(sequences):
        span = list(range(n, len(ids) - 1))  # roots whose slot 0 is a generated token
        if not span:
            continue
        roots = span if len(span) <= anchors else sorted(rng.sample(span, anchors))
        parts.append(sequence_blocks(models, torch.tensor([ids], device=dev), torch.tensor([roots], device=dev), K,
                                     torch.tensor([g])))
    return Blocks.cat(parts) if parts else None


def cond_replayed(blocks, head, budget: int, chunk: int = 256) -> list[tuple[np.ndarray, np.ndarray]]:
    """CondTree(budget) rebuilt on every block as the policy builds it (the head's increments, the conditioned
    tree): (node scores, indices of the accepted path's nodes) per block, as ``pair_replayed`` gives them."""
    from ddtree_kernels.cond_tree import build_cond_tree
    from workbench.calibrate.choose import accepted_path
    from workbench.engine.policies.cond_head import conditioned_increments

    n, D, K = blocks.topi.shape
    k = min(budget, head.K, K)
    ranks = blocks.ranks.numpy()  # [n, D]: the target's rank per slot (K: none of them, -1: past the end)
    out = []
    for a in range(0, n, chunk):
        part = slice(a, a + chunk)
        roots = blocks.path[part, 0]  # [c]
        inc = conditioned_increments(head, blocks.hidden[part], blocks.topv[part], blocks.topi[part], roots, k)
        t = build_cond_tree(inc, blocks.topi[part, :, :k], roots, budget)  # [c, D, k, k] increments -> trees
        for i in range(t.parents.shape[0]):
            path = accepted_path(t.parents[i].tolist(), t.rank[i].tolist(), ranks[a + i], D)
            out.append((t.score[i, 1:].numpy(), np.array(path, dtype=np.int64)))
    return out


def replay_rates(cyc, cal, families: list[str], batches, sizes, learned=None) -> dict:
    """batch -> family -> {size: replayed tokens per predicted ms} (``workbench.calibrate.choose.rate``).
    learned: (CondTree's head, the blocks it is replayed on), when CondTree is among ``families``."""
    from workbench.calibrate.choose import rate, replayed
    from workbench.engine.policies.cost_tree import budget_for
    from workbench.engine.policies.cut_tree import kept_nodes

    cost = cal.step_cost()
    head, beta = cal.head() if "pair-tree" in families else (None, 0.0)
    out = {b: {f: {} for f in families} for b in batches}
    for n in sizes:
        path = replayed(cyc, cal.model, n, None) if set(families) - {"pair-tree", LEARNED} else []
        own = {"pair-tree": pair_replayed(cyc, head, beta, n) if "pair-tree" in families else [],
               LEARNED: cond_replayed(learned[1], learned[0], n) if LEARNED in families else []}
        for b in batches:
            keep = {"path-tree": lambda t: [len(s) for s, _ in t],
                    "cut-tree": lambda t: [kept_nodes(s, cal.threshold("tree", b)) for s, _ in t],
                    "cost-tree": lambda t: [budget_for(s, b, cost) for s, _ in t],
                    "pair-tree": lambda t: [len(s) for s, _ in t], LEARNED: lambda t: [len(s) for s, _ in t]}
            for f in families:
                trees = own.get(f, path)
                out[b][f][n] = rate(trees, keep[f](trees), b, cost)["tokens_per_ms"]
    return out


def pair_calibration(mine, pair: dict):
    """The calibration the sizes are costed with: the calibrated policies' own (one per pair), or, when CondTree
    is the only one sized, the shipped calibration made on the pair (None: there is none)."""
    from workbench.engine.policies.calibration import shipped_for

    for s in mine:
        if s.family != LEARNED:
            return s.policy.calibration_data()
    return shipped_for(pair)


def size_policies(engine, shapes, batches, measured: list[str], given: list[str] | None = None,
                  max_new_tokens: int = SIZING_NEW_TOKENS, progress=None) -> Sizing | None:
    """The sizes of the calibrated policies among ``shapes`` (bound to the pair) per batch size, chosen on
    calibration prompts (see the module's docstring); None when none is among them."""
    from workbench.calibrate.collect import collect
    from workbench.models.identity import pair_identity

    mine = [s for s in shapes if s.family in SIZED_FAMILIES]
    if not mine:
        return None
    m = engine.models
    cal = pair_calibration(mine, pair_identity(m))  # one calibration per pair: every calibrated policy's
    if cal is None or cal.cost is None:
        why = (f"calibration {cal.path} holds no cost table to size them with (python -m workbench.calibrate "
               "--costs FILE)") if cal is not None else "no shipped calibration was made on this pair to cost them"
        return Sizing({b: {} for b in batches}, {}, 0, 0, [f"calibrated policies at their default sizes: {why}"])
    texts, notes = calibration_texts(measured, given)
    slots, vocab = m.block_size - 1, int(m.target.config.get_text_config().vocab_size)
    sizes = [n for n in SIZES if all(dataclasses.replace(s.policy, budget=n).capacity(slots, vocab) is None
                                     for s in mine)]
    cyc = collect(engine, texts, max_new_tokens, cal.width, progress)
    families = list(dict.fromkeys(s.family for s in mine))
    learned = None
    if LEARNED in families:
        head = next(s.policy for s in mine if s.family == LEARNED).head_data()
        blocks = cond_blocks(m, cyc.sequences, head.K)
        if blocks is None:
            families.remove(LEARNED)
            notes.append("CondTree at its default size: the calibration decodes left no continuation to replay it on")
        else:
            learned = (head, blocks)
    figures = replay_rates(cyc, cal, families, batches, sizes, learned)
    chosen = {b: {f: max(sizes, key=lambda n: (figures[b][f][n], -n)) for f in families} for b in batches}
    n_blocks = int(learned[1].group.numel()) if learned else 0
    return Sizing(chosen, figures, len(texts), int(cyc.topv.shape[0]), notes, n_blocks)


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
