"""Budget needed: how many best-first nodes would a tree have needed to contain the target's continuation?

After a run the target's continuation after every cycle's root is known: the generated
tokens that follow it (under greedy decoding, the target's own choices). DDTree's tree at
budget B is the B highest-scoring prefixes of the drafter's per-slot log-probs, so a cycle
accepts L tokens at budget B exactly when the continuation's length-L prefix ranks within
the best B. This module recomputes those ranks from the recorded drafter top-k with the same
kernel and tie rule as the engine.

Limit: a cycle records only the drafter's top ``record_topk`` tokens per slot (8 by
default). A prefix in the best B uses tokens of rank < B at every slot, so ranks are exact
for B <= record_topk; record more (``engine.session(..., record_topk=64)``) to look further.

Other budgets also move the cycle boundaries (the next cycle starts where this one stopped),
so ``tau_at(B)`` from one run predicts a run at budget B, it does not replay it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ddtree_kernels import build_tree
from workbench.analysis.calibration import cycles_of
from workbench.cycle import Trace


def continuation_stream(trace: Trace) -> tuple[list[int], list[int]]:
    """The token stream from the first cycle's root on, and each cycle's root index in it.

    Cycle c accepts root + L drafts; the next cycle's root is its bonus. The last cycle's
    accepted path and bonus are kept even where the output was cut at the token limit.
    """
    cycles = trace.cycles
    stream: list[int] = []
    roots: list[int] = []
    for i, c in enumerate(cycles):
        if i and c.start != cycles[i - 1].start + cycles[i - 1].accept_length:
            raise ValueError(f"trace cycles {i - 1} and {i} are not consecutive (start {cycles[i - 1].start} + "
                             f"{cycles[i - 1].accept_length} != {c.start}); pass one session's whole trace")
        roots.append(len(stream))
        stream.extend(c.accepted_tokens.tolist())
    if cycles:
        stream.append(cycles[-1].bonus)
    return stream, roots


def _sorted_topk(c) -> tuple[torch.Tensor, torch.Tensor]:
    """The recorded top-k per slot in the kernel's order: log-prob descending, then token id ascending."""
    v, i = c.draft_topk_logprobs.float(), c.draft_topk_tokens.long()
    # Sort by token id, then stably by value: equal values end up by ascending id.
    o = torch.argsort(i, dim=1)
    v, i = v.gather(1, o), i.gather(1, o)
    o = torch.sort(v, dim=1, descending=True, stable=True).indices
    return v.gather(1, o), i.gather(1, o)


@dataclass(frozen=True)
class BudgetNeeded:
    """Ranks of the target's continuation prefixes among all drafted prefixes, cycle by cycle."""

    ranks: np.ndarray  # float [cycles, Dmax]: column L-1 = nodes a best-first tree needs to hold the length-L
    #                    prefix (1 = the best node); inf beyond max_budget; nan where no such prefix was drafted
    accepted: np.ndarray  # int [cycles]: drafted tokens the run actually accepted
    max_budget: int  # ranks above it are only known to be larger
    record_topk: int
    policy: str

    @property
    def cycles(self) -> int:
        return int(self.ranks.shape[0])

    def _check(self, budget: int) -> None:
        if not 0 <= budget <= self.max_budget:
            raise ValueError(f"budget={budget} is beyond what this trace can answer (max_budget={self.max_budget}, "
                             f"drafter top-{self.record_topk} recorded); record more with record_topk=N")

    def accepted_at(self, budget: int) -> np.ndarray:
        """Per cycle: drafted tokens a best-first tree of ``budget`` nodes would accept."""
        self._check(budget)
        with np.errstate(invalid="ignore"):
            return (self.ranks <= budget).sum(1)  # ranks grow along the path: the count is the length

    def tau_at(self, budget: int) -> float:
        """Predicted tau (accepted + bonus per cycle) at ``budget``."""
        return float(np.mean(self.accepted_at(budget) + 1)) if self.cycles else 0.0

    def needed(self) -> np.ndarray:
        """Per cycle: nodes a best-first tree needed to hold the path this run accepted (0 if none)."""
        L = self.accepted
        out = np.zeros(self.cycles)
        has = L > 0
        out[has] = self.ranks[np.nonzero(has)[0], L[has] - 1]
        return out

    def curve(self, budgets=None) -> dict:
        """Fraction of cycles whose accepted length L was reachable within budget B, against B;
        and per length L, the fraction of cycles (that drafted L slots) whose length-L prefix was."""
        budgets = list(budgets) if budgets is not None else default_budgets(self.max_budget)
        for b in budgets:
            self._check(b)
        need = self.needed()
        frac = [float(np.mean(need <= b)) if self.cycles else 0.0 for b in budgets]
        by_length = {}
        for L in range(1, self.ranks.shape[1] + 1):
            col = self.ranks[:, L - 1]
            col = col[~np.isnan(col)]
            if col.size:
                by_length[L] = [float(np.mean(col <= b)) for b in budgets]
        return {"budget": budgets, "fraction": frac, "by_length": by_length,
                "tau": [self.tau_at(b) for b in budgets]}

    def __str__(self) -> str:
        return (f"budget needed ({self.policy}, {self.cycles} cycles, exact up to {self.max_budget} nodes): "
                f"median {np.median(self.needed()):.0f} nodes for the accepted path, "
                f"predicted tau at {self.max_budget}: {self.tau_at(self.max_budget):.3f}")


def default_budgets(max_budget: int) -> list[int]:
    b, out = 1, []
    while b < max_budget:
        out.append(b)
        b *= 2
    return out + [max_budget]


def budget_needed(trace: Trace, max_budget: int | None = None) -> BudgetNeeded:
    """Rank of the target's continuation prefix of every length among the drafter's prefixes, per cycle.

    ``max_budget`` (default: the recorded top-k width) bounds the ranks computed; it cannot exceed
    the recorded width (``Cycle.draft_topk_*``), where ranks stop being exact.
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"budget_needed takes one session's Trace, got {type(trace).__name__}")
    cycles = trace.cycles
    if not cycles_of(trace):
        raise ValueError("no drafted cycles in this trace (AR drafts nothing); record a DFlash, DDTree or "
                         "EagleTree run")
    k = int(cycles[0].draft_topk_tokens.shape[1])
    max_budget = k if max_budget is None else max_budget
    if isinstance(max_budget, bool) or not isinstance(max_budget, int) or max_budget < 1:
        raise ValueError(f"max_budget={max_budget!r} must be a positive integer")
    if max_budget > k:
        raise ValueError(f"max_budget={max_budget} but the trace recorded only the drafter's top-{k} per slot, so "
                         f"ranks are exact up to {k}; rerun with engine.session(..., record_topk={max_budget})")
    stream, roots = continuation_stream(trace)
    S = torch.tensor(stream + [-1] * 64)
    Dmax = max(int(c.draft_topk_tokens.shape[0]) for c in cycles)
    ranks = np.full((len(cycles), Dmax), np.nan)
    by_depth: dict[int, list[int]] = {}
    for i, c in enumerate(cycles):
        by_depth.setdefault(int(c.draft_topk_tokens.shape[0]), []).append(i)
    for D, idx in by_depth.items():
        if D == 0:  # a root-only cycle (the last token of a run): nothing drafted, nothing to rank
            continue
        vals, ids = zip(*(_sorted_topk(cycles[i]) for i in idx))
        vals, ids = torch.stack(vals), torch.stack(ids)  # [g, D, k]
        g = len(idx)
        # Best-first tree over the recorded columns; node order = rank (index 1 = the best prefix).
        tree = build_tree(vals, torch.zeros(g, dtype=torch.long), max_budget)
        d = tree.depth
        col = tree.tokens.clamp(max=k - 1)
        tok = ids.gather(2, col[:, None, :].expand(g, D, -1)).gather(1, (d - 1).clamp(min=0)[:, None, :])[:, 0]
        start = torch.tensor([roots[i] for i in idx])
        y = S[(start[:, None] + torch.arange(1, D + 1)[None, :]).clamp(max=S.numel() - 1)]  # [g, D] continuation
        y = torch.where(start[:, None] + torch.arange(1, D + 1)[None, :] < len(stream), y, -1)
        agree = tok == y.gather(1, (d - 1).clamp(min=0))
        agree[:, 0] = True
        match = agree.clone()
        for _ in range(D):  # a node matches when it and every ancestor agree with the continuation
            match = agree & match.gather(1, tree.parents.clamp(min=0))
        r = torch.full((g, D + 1), float("inf"), dtype=torch.float64)
        pos = torch.arange(tree.n, dtype=torch.float64).expand(g, -1)
        r.scatter_reduce_(1, torch.where(match, d, 0), torch.where(match, pos, float("inf")), reduce="amin")
        r = r[:, 1:]
        avail = (start[:, None] + torch.arange(1, D + 1)[None, :]) < len(stream)
        r = torch.where(avail, r, float("nan"))
        ranks[idx, :D] = r.numpy()
    accepted = np.array([c.accepted for c in cycles])
    return BudgetNeeded(ranks, accepted, max_budget, k, trace.policy)
