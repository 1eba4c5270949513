"""Choosing CutTree's threshold and the pair head's beta on the calibration cycles, and the offline figures
beside them.

For every calibration cycle the path-conditioned tree is built exactly as the policy builds it (the fitted
model's increments, ``ddtree_kernels.path_tree``), and the target's recorded ranks say which of its nodes the
target would accept: the accepted path is the chain of nodes whose ranks are the target's, and a cut keeping
the first m nodes (best-first order, so a prefix) accepts the path nodes among them. Cycles are dealt into
batches of ``rows`` (a fixed shuffle): a batch costs the pair's step time at its widest row
(``StepCost.ms(rows, max nodes)``) and commits every row's accepted tokens plus bonus. The threshold with the
most committed tokens per ms is chosen per shape ("tree": the default budget; "chain": width 1) and batch size.

These are replays of recorded cycles, with the single-trace counterfactual's bias (``docs/pays-off.md``: a
tree run moves every later cycle boundary): they choose a setting, they do not measure a speed.
"""
from __future__ import annotations

import numpy as np
import torch

from ddtree_kernels.path_tree import STATES, path_tree_heap, rank_class
from workbench.calibrate.collect import Cycles
from workbench.engine.policies.cost_tree import budget_for
from workbench.engine.policies.cut_tree import kept_nodes
from workbench.engine.policies.pair_chain import best_chain
from workbench.engine.policies.pair_head import conditioned_increments
from workbench.engine.policies.path_model import PathModel
from workbench.engine.policies.step_cost import StepCost

THRESHOLDS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
SHAPES = {"tree": dict(budget=16, width=None), "chain": dict(budget=None, width=1)}  # CutTree's defaults
BATCH_ROWS = (1, 8)


def replayed(cyc: Cycles, model: PathModel | None, budget: int, width: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per cycle: (node scores [n] in node order, indices of the accepted path's nodes [a], increasing).
    ``model`` None: DDTree's scores (the drafter's marginals, whatever the branch)."""
    K = cyc.K
    k = min(budget, width or budget, K)
    out = []
    for c in range(cyc.topv.shape[0]):
        top = torch.from_numpy(cyc.topv[c : c + 1, :, :k].astype(np.float32))  # [1, D, k]
        D = int(np.isfinite(cyc.topv[c, :, 0]).sum())  # slots drafted this cycle
        top = top[:, :D]
        if D == 0:
            out.append((np.zeros(0), np.zeros(0, dtype=np.int64)))
            continue
        inc = model.log_q(top) if model is not None else top.double()[..., None].expand(1, D, k, 3)
        ids = torch.arange(k).expand(1, D, k)  # token = rank: the walk below reads ranks
        t = path_tree_heap(inc, ids, torch.zeros(1, dtype=torch.long), budget)
        path = accepted_path(t.parents[0].tolist(), t.rank[0].tolist(), cyc.ranks[c], D)
        out.append((t.score[0, 1:].numpy(), np.array(path, dtype=np.int64)))
    return out


def rate(trees, keep, rows: int, cost: StepCost, seed: int = 0) -> dict:
    """Committed tokens per ms when cycle i verifies its first keep[i] nodes, dealt into batches of ``rows``."""
    n = len(trees)
    order = np.random.default_rng(seed).permutation(n)
    tokens = np.array([1 + int(np.sum(p < keep[i] + 1)) if len(p) else 1 for i, (_, p) in enumerate(trees)])
    ms, tok, nodes = 0.0, 0, []
    for g in range(0, n - rows + 1, rows):
        idx = order[g : g + rows]
        ms += float(cost.ms(rows, int(max(keep[i] for i in idx)) + 1))
        tok += int(tokens[idx].sum())
        nodes += [int(keep[i]) for i in idx]
    return {"tokens_per_ms": tok / ms if ms else float("nan"), "tau": tok / max(1, len(nodes)),
            "mean_nodes": float(np.mean(nodes)) if nodes else 0.0}


def choose_thresholds(cyc: Cycles, model: PathModel, cost: StepCost, seed: int = 0) -> tuple[dict, dict]:
    """-> ({"tree" | "chain": {"rows": threshold}}, the replay's figures: every threshold's rate, and beside
    them the uncut shape, DDTree(16) and CostTree(64) replayed the same way)."""
    D = cyc.topv.shape[1]
    chosen, figures = {}, {}
    for shape, kw in SHAPES.items():
        budget = kw["budget"] or D
        trees = replayed(cyc, model, budget, kw["width"])
        full = [len(s) for s, _ in trees]
        chosen[shape], figures[shape] = {}, {}
        for rows in BATCH_ROWS:
            curve = {str(t): rate(trees, [kept_nodes(s, t) for s, _ in trees], rows, cost, seed) for t in THRESHOLDS}
            best = max(THRESHOLDS, key=lambda t: (curve[str(t)]["tokens_per_ms"], -t))
            chosen[shape][str(rows)] = best
            figures[shape][str(rows)] = {"chosen": best, "by_threshold": curve,
                                         "uncut": rate(trees, full, rows, cost, seed)}
    marginal = replayed(cyc, None, 16, None)
    costed = replayed(cyc, model, 64, None)
    figures["reference"] = {}
    for rows in BATCH_ROWS:
        figures["reference"][str(rows)] = {
            "DDTree(16)": rate(marginal, [len(s) for s, _ in marginal], rows, cost, seed),
            "PathTree(16)": figures["tree"][str(rows)]["uncut"],
            "CostTree(64)": rate(costed, [budget_for(s, rows, cost) for s, _ in costed], rows, cost, seed)}
    return chosen, figures


def summary(figures: dict) -> str:
    """One line per batch size: the replayed tokens per ms of each reference shape and the chosen cuts."""
    lines = []
    for rows, ref in figures["reference"].items():
        parts = [f"{k} {v['tokens_per_ms']:.3f} (tau {v['tau']:.2f}, {v['mean_nodes']:.1f} nodes)" for k, v in ref.items()]
        for shape in SHAPES:
            f = figures[shape][rows]
            v = f["by_threshold"][str(f["chosen"])]
            parts.append(f"CutTree {shape} @ {f['chosen']} {v['tokens_per_ms']:.3f} (tau {v['tau']:.2f}, "
                         f"{v['mean_nodes']:.1f} nodes)")
        lines.append(f"batch {rows}, replayed tokens/ms: " + "; ".join(parts))
    return "\n".join(lines)



# ------------------------------------------------------------------------------------------ the pair head's beta
BETAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)
PAIR_BUDGET, PAIR_WIDTH = 16, 8  # PairTree(16) and PairChain(8), the shapes beta is chosen on


def pair_replay(cyc: Cycles, head, beta: float) -> dict:
    """Mean committed tokens per cycle (tau) of PairTree(16) and PairChain(8) replayed on the cycles."""
    tree_tok, chain_tok = [], []
    for c in range(cyc.topv.shape[0]):
        D = int(np.isfinite(cyc.topv[c, :, 0]).sum())
        if D == 0:
            continue
        k = min(PAIR_BUDGET, cyc.K)
        topv = torch.from_numpy(cyc.topv[c : c + 1, :D, :k].astype(np.float32))
        topi = torch.from_numpy(cyc.topi[c : c + 1, :D, :k])
        root = torch.tensor([int(cyc.path[c, 0])])
        inc = conditioned_increments(head, topv, topi, root, beta)  # [1, D, k, k]
        t = path_tree_heap(inc, topi, root, PAIR_BUDGET, rank_class, 0)
        tree_tok.append(1 + len(accepted_path(t.parents[0].tolist(), t.rank[0].tolist(), cyc.ranks[c], D)))
        w = min(PAIR_WIDTH, k)
        ranks, _ = best_chain(inc[:, :, :w, :w])
        r = ranks[0].tolist()
        n = 0
        while n < D and r[n] == int(cyc.ranks[c, n]):
            n += 1
        chain_tok.append(1 + n)
    return {"PairTree(16) tau": float(np.mean(tree_tok)), "PairChain(8) tau": float(np.mean(chain_tok))}


def accepted_path(parents: list, ranks: list, target_ranks: np.ndarray, D: int) -> list:
    """Node indices of the path the target accepts: from the root, the child whose rank is the target's."""
    children = {(parents[i], ranks[i]): i for i in range(1, len(parents))}
    path, node = [], 0
    for d in range(D):
        nxt = children.get((node, int(target_ranks[d])))
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path


def next_top1(cyc: Cycles, head, beta: float) -> dict:
    """Share of slots whose target token is the top candidate after rescoring with the target's own previous
    token, by the path state above the slot (the measurement behind the head: the branching table's rates)."""
    from workbench.calibrate.fit import path_states

    K = cyc.K
    topv = torch.from_numpy(np.where(np.isfinite(cyc.topv), cyc.topv, -1e9).astype(np.float32))
    topi = torch.from_numpy(cyc.topi.clip(min=0))
    prev = torch.from_numpy(cyc.path[:, :-1].clip(min=0))  # [C, D]: the target's token before each slot
    best = head.rescored(topv, topi, prev, beta).argmax(-1).numpy()  # [C, D]
    state, usable = path_states(cyc.ranks, K)
    out = {}
    for s, name in enumerate(STATES):
        at = usable & (state == s)
        out[name] = {"slots": int(at.sum()), "top1": float(np.mean(best[at] == cyc.ranks[at])) if at.any() else None}
    return out


def choose_beta(cyc: Cycles, head) -> tuple[float, dict]:
    """The beta with the most replayed tokens per cycle for PairTree(16) (ties: the smaller), and the figures:
    every beta's replayed tau of PairTree(16) and PairChain(8), and the next-token top-1 rates by path state
    without the head (beta 0) and with the chosen beta."""
    by_beta = {str(b): pair_replay(cyc, head, b) for b in BETAS}
    beta = max(BETAS, key=lambda b: (by_beta[str(b)]["PairTree(16) tau"], -b))
    return beta, {"by_beta": by_beta, "top1_without_head": next_top1(cyc, head, 0.0),
                  "top1_with_head": next_top1(cyc, head, beta)}
