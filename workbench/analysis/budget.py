"""Budget needed: how many best-first nodes would a tree have needed to contain the target's continuation?

After a run the target's continuation after every cycle's root is known: the generated
tokens that follow it (under greedy decoding, the target's own choices). DDTree's tree at
budget B is the B highest-scoring prefixes of the drafter's per-slot log-probs, so a cycle
accepts L tokens at budget B exactly when the continuation's length-L prefix ranks within
the best B. This module recomputes those ranks from the recorded drafter top-k, in the
tree build's order and tie rule, with per-depth beams of scores only (no tree is built).

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

from workbench.analysis.reliability import cycles_of
from workbench.records.cycle import Trace


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


def _sorted_topk(vals: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Recorded top-k [g, D, k] in the tree build's order: log-prob descending, then token id ascending."""
    o = torch.argsort(ids, dim=-1)
    vals, ids = vals.gather(-1, o), ids.gather(-1, o)
    o = torch.sort(vals, dim=-1, descending=True, stable=True).indices  # equal values keep ascending ids
    return vals.gather(-1, o), ids.gather(-1, o)


def continuation_ranks(vals: torch.Tensor, ids: torch.Tensor, y: torch.Tensor, budget: int) -> torch.Tensor:
    """Rank of every prefix of ``y`` in DDTree's best-first order, exact up to ``budget``.

    vals/ids: [g, D, k] per-slot top-k (sorted, k >= budget); y: int64 [g, D] continuation (-1: unknown).
    -> float64 [g, D]: 1-based rank of y[:L] (column L-1), inf when beyond ``budget``.

    Same order as ``build_tree``: score descending, then depth ascending, then the position in its
    depth's beam (parent's beam position, then token rank). Only the best ``budget`` prefixes of each
    depth can be in the tree, so per depth a beam of that many scores is enough: the rank of y[:L] is
    1 + (beam scores >= s at smaller depths) + (its own beam position) + (scores > s at larger depths).
    """
    g, D, _ = vals.shape
    B = budget
    v, t = vals[:, :, :B].float(), ids[:, :, :B]
    hit = t == y[:, :, None]  # [g, D, B]
    yr = torch.where(hit.any(-1), hit.float().argmax(-1), -1)  # token rank of y at each slot, -1 if beyond B
    # Candidate (parent beam position p, token rank j) pairs that can make a depth's best B, row-major:
    # (p, j) trails every (p' <= p, j' <= j), so (p+1)(j+1) > B never makes it (as in the tree build).
    p_all = torch.arange(B)[:, None].expand(B, B)
    j_all = torch.arange(B)[None, :].expand(B, B)
    keep = (p_all + 1) * (j_all + 1) <= B
    pp, jj = p_all[keep], j_all[keep]  # [m]
    where = torch.full((B, B), -1, dtype=torch.long)
    where[keep] = torch.arange(int(keep.sum()))
    beams, s_y, pos_y = [], [], []
    beam = v[:, 0]  # [g, B]: float32 sums, as the tree build adds them
    pos = yr[:, 0]
    s = torch.where(pos >= 0, beam.gather(1, pos.clamp(min=0)[:, None])[:, 0], float("nan"))
    beams.append(beam), s_y.append(s), pos_y.append(pos)
    for d in range(1, D):
        ok_pair = (pp < beam.shape[1]) & (jj < v.shape[2])  # fewer when the vocabulary is below B
        sub = torch.full((pp.shape[0] + 1,), -1, dtype=torch.long)  # kept-pair index -> column of cand
        sub[:-1][ok_pair] = torch.arange(int(ok_pair.sum()))
        cand = beam[:, pp[ok_pair]] + v[:, d, jj[ok_pair]]  # [g, m]
        j = yr[:, d]
        yi = sub[where[pos.clamp(min=0), j.clamp(min=0)]]  # where == -1 reads the spare -1 entry
        ok = (pos >= 0) & (j >= 0) & (yi >= 0) & (yi < cand.shape[1])
        yi = yi.clamp(min=0, max=cand.shape[1] - 1)
        s = torch.where(ok, cand.gather(1, yi[:, None])[:, 0], float("nan"))
        idx = torch.arange(cand.shape[1])
        ahead = (cand > s[:, None]) | ((cand == s[:, None]) & (idx[None, :] < yi[:, None]))
        pos = torch.where(ok, ahead.sum(1), -1)
        pos = torch.where(pos < B, pos, -1)
        beam = torch.topk(cand, min(B, cand.shape[1]), dim=1).values
        beams.append(beam), s_y.append(s), pos_y.append(pos)
    S = torch.stack(s_y, 1)  # [g, D]: score of y[:L] (nan when not in its depth's beam)
    P = torch.stack(pos_y, 1)  # [g, D]: its position in its depth's beam, -1 if not there
    # Per-depth beams as ascending negated scores, padded with +inf: counts by binary search.
    neg = torch.stack([torch.nn.functional.pad(-b, (0, B - b.shape[1]), value=float("inf")) for b in beams], 1)
    q = (-S)[:, None, :].expand(g, D, D).contiguous()  # [g, D(d), D(L)]
    ge = torch.searchsorted(neg.contiguous(), q, right=True)  # beam_d scores >= s_L
    gt = torch.searchsorted(neg.contiguous(), q, right=False)  # beam_d scores > s_L
    dd = torch.arange(D)[:, None]
    LL = torch.arange(D)[None, :]
    before = torch.where(dd < LL, ge, 0).sum(1)  # [g, D(L)]
    after = torch.where(dd > LL, gt, 0).sum(1)
    rank = (1 + before + P + after).double()
    return torch.where((P >= 0) & (rank <= B), rank, float("inf"))


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
        need = self.needed()
        blind = int(np.isinf(need).sum())  # accepted paths ranked beyond what the recorded top-k can see
        med = float(np.median(need)) if need.size else 0.0
        median = (f"median {med:.0f} nodes" if np.isfinite(med) else
                  f"median more than {self.max_budget} nodes (beyond what was recorded)")
        seen = (f"; {blind} of {self.cycles} accepted paths need more than {self.max_budget} nodes, which the "
                f"recorded drafter top-{self.record_topk} cannot rank: record more with "
                f"engine.session(..., record_topk=64)" if blind else "")
        return (f"budget needed ({self.policy}, {self.cycles} cycles, exact up to {self.max_budget} nodes): "
                f"{median} for the accepted path, predicted tau at {self.max_budget}: "
                f"{self.tau_at(self.max_budget):.3f}{seen}")


def default_budgets(max_budget: int) -> list[int]:
    b, out = 1, []
    while b < max_budget:
        out.append(b)
        b *= 2
    return out + [max_budget]


def budget_needed(trace, max_budget: int | None = None) -> BudgetNeeded:
    """Rank of the target's continuation prefix of every length among the drafter's prefixes, per cycle.

    ``trace``: one session's Trace, or a list of them (pooled cycle by cycle). ``max_budget``
    (default: the recorded top-k width) bounds the ranks computed; it cannot exceed the recorded
    width (``Cycle.draft_topk_*``), where ranks stop being exact.
    """
    if isinstance(trace, (list, tuple)):
        if not trace:
            raise ValueError("budget_needed got an empty list of traces")
        parts = [budget_needed(t, max_budget) for t in trace]
        D = max(p.ranks.shape[1] for p in parts)
        ranks = np.concatenate([np.pad(p.ranks, ((0, 0), (0, D - p.ranks.shape[1])), constant_values=np.nan)
                                for p in parts])
        policies = sorted({p.policy for p in parts})
        return BudgetNeeded(ranks, np.concatenate([p.accepted for p in parts]), min(p.max_budget for p in parts),
                            min(p.record_topk for p in parts), ", ".join(policies))
    if not isinstance(trace, Trace):
        raise TypeError(f"budget_needed takes a session's Trace (or a list of them), got {type(trace).__name__}")
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
    S = torch.tensor(stream)
    Dmax = max(int(c.draft_topk_tokens.shape[0]) for c in cycles)
    ranks = np.full((len(cycles), Dmax), np.nan)
    by_depth: dict[int, list[int]] = {}
    for i, c in enumerate(cycles):
        by_depth.setdefault(int(c.draft_topk_tokens.shape[0]), []).append(i)
    for D, idx in by_depth.items():
        if D == 0:  # a root-only cycle (the last token of a run): nothing drafted, nothing to rank
            continue
        vals, ids = _sorted_topk(torch.stack([cycles[i].draft_topk_logprobs.float() for i in idx]),
                                 torch.stack([cycles[i].draft_topk_tokens.long() for i in idx]))  # [g, D, k]
        at = torch.tensor([roots[i] for i in idx])[:, None] + torch.arange(1, D + 1)[None, :]  # stream index
        avail = at < len(stream)
        y = torch.where(avail, S[at.clamp(max=S.numel() - 1)], -1)  # [g, D] the target's continuation
        r = continuation_ranks(vals, ids, y, max_budget)
        ranks[idx, :D] = torch.where(avail, r, float("nan")).numpy()
    accepted = np.array([c.accepted for c in cycles])
    return BudgetNeeded(ranks, accepted, max_budget, k, trace.policy)
