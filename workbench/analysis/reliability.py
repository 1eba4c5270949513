"""The drafter's reliability: does a drafted node of path probability p get accepted with frequency p?

A node is *accepted* when it was reached (its parent was accepted) and the target agreed
with its token; under greedy decoding that means the target's own continuation starts with
the node's path, so a calibrated drafter's path probabilities match these frequencies. This
is DDTree's premise: it ranks prefixes by exactly that probability.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from workbench.records.cycle import Cycle, Trace

KINDS = ("path", "token")


def cycles_of(traces) -> list[Cycle]:
    """Trace | Cycle list | iterable of Traces -> the drafted cycles (trees with at least one node)."""
    if isinstance(traces, (Trace, Cycle)):
        traces = [traces]
    out: list[Cycle] = []
    for t in traces:
        if isinstance(t, Cycle):
            out.append(t)
        elif isinstance(t, Trace):
            out.extend(t.cycles)
        else:
            raise TypeError(f"expected Trace or Cycle records, got {type(t).__name__}")
    return [c for c in out if c.n_nodes > 0]


@dataclass
class NodeTable:
    """Every drafted node of every cycle, flattened (root rows dropped)."""

    cycle: np.ndarray  # int [N]: position of the node's cycle in the list
    depth: np.ndarray  # int [N]
    path_prob: np.ndarray  # float [N]: exp(path log-prob)
    token_prob: np.ndarray  # float [N]: drafter probability of the token given its parent's path
    parent_accepted: np.ndarray  # bool [N]: the node was reached
    accepted: np.ndarray  # bool [N]: reached and agreed


def node_table(cycles: list[Cycle]) -> NodeTable:
    sizes = torch.tensor([c.tokens.shape[0] for c in cycles])
    offsets = torch.cumsum(sizes, 0) - sizes
    score = torch.cat([c.score.float() for c in cycles]).double()
    parents = torch.cat([c.parents for c in cycles])
    depth = torch.cat([c.depth for c in cycles])
    cyc = torch.repeat_interleave(torch.arange(len(cycles)), sizes)
    acc = torch.zeros(score.shape[0], dtype=torch.bool)
    acc[torch.cat([c.accepted_nodes for c in cycles]) + torch.repeat_interleave(
        offsets, torch.tensor([c.accepted_nodes.shape[0] for c in cycles]))] = True
    gpar = parents.clamp(min=0) + offsets[cyc]  # the root's "parent" is itself; dropped below
    keep = parents >= 0
    return NodeTable(
        cycle=cyc[keep].numpy(), depth=depth[keep].numpy(),
        path_prob=torch.exp(score[keep]).numpy(), token_prob=torch.exp(score[keep] - score[gpar[keep]]).numpy(),
        parent_accepted=acc[gpar[keep]].numpy(), accepted=acc[keep].numpy(),
    )


@dataclass(frozen=True)
class Reliability:
    """Reliability bins, expected calibration error and per-depth acceptance."""

    kind: str  # "path": every node, p = path probability; "token": reached nodes, p = token given its path
    edges: np.ndarray  # [bins + 1]
    count: np.ndarray  # int [bins]
    mean_prob: np.ndarray  # [bins]: mean predicted probability (nan for an empty bin)
    rate: np.ndarray  # [bins]: share accepted (nan for an empty bin)
    ece: float  # sum over bins of count/N * |mean_prob - rate|
    nodes: int
    cycles: int
    depth: np.ndarray  # int [Dmax]: 1..Dmax
    depth_reached: np.ndarray  # int [Dmax]: cycles whose accepted path reached depth d-1 and that drafted a child there
    depth_accepted: np.ndarray  # int [Dmax]: cycles whose accepted path reached depth d
    depth_rate: np.ndarray  # [Dmax]: accepted / reached (nan when never reached)
    depth_predicted: np.ndarray  # [Dmax]: mean drafter mass on the drafted children, over reached cycles

    def table(self) -> list[dict]:
        """One row per non-empty bin."""
        return [{"bin": f"[{self.edges[i]:.3g}, {self.edges[i + 1]:.3g})", "nodes": int(self.count[i]),
                 "mean_prob": float(self.mean_prob[i]), "accept_rate": float(self.rate[i])}
                for i in range(len(self.count)) if self.count[i]]

    def depth_table(self) -> list[dict]:
        return [{"depth": int(d), "reached": int(r), "accepted": int(a), "rate": float(x), "predicted": float(p)}
                for d, r, a, x, p in zip(self.depth, self.depth_reached, self.depth_accepted, self.depth_rate,
                                         self.depth_predicted) if r]

    def __str__(self) -> str:
        return (f"reliability ({self.kind}): ECE {self.ece:.4f} over {self.nodes} nodes in {self.cycles} cycles, "
                f"{int((self.count > 0).sum())} non-empty bins")


def reliability(traces, bins: int = 10, kind: str = "path", strategy: str = "uniform") -> Reliability:
    """Drafted probability against empirical acceptance, over every drafted node of ``traces``.

    ``kind="path"``: every node, p = its drafted path probability exp(score), outcome = accepted.
    ``kind="token"``: only reached nodes (parent accepted), p = the drafter's probability of the
    node's token given its path, outcome = the target agreed. ``strategy``: "uniform" bins of
    [0, 1] or "quantile" bins with equal node counts.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; use 'path' or 'token'")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins={bins!r} must be a positive integer")
    if strategy not in ("uniform", "quantile"):
        raise ValueError(f"strategy={strategy!r}; use 'uniform' or 'quantile'")
    cycles = cycles_of(traces)
    if not cycles:
        raise ValueError("no drafted cycles in these traces (AR runs draft nothing); record a DFlash, DDTree or "
                         "EagleTree run")
    t = node_table(cycles)
    sel = np.ones_like(t.accepted) if kind == "path" else t.parent_accepted
    p = (t.path_prob if kind == "path" else t.token_prob)[sel]
    y = t.accepted[sel].astype(float)
    if strategy == "uniform":
        edges = np.linspace(0.0, 1.0, bins + 1)
    else:
        edges = np.quantile(p, np.linspace(0, 1, bins + 1)) if p.size else np.linspace(0.0, 1.0, bins + 1)
        edges[0], edges[-1] = 0.0, 1.0
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_prob = np.bincount(which, weights=p, minlength=bins) / count
        rate = np.bincount(which, weights=y, minlength=bins) / count
    n = int(count.sum())
    ece = float(np.nansum(count / max(n, 1) * np.abs(mean_prob - rate)))

    # Per depth: which depths each cycle's accepted path reached, and the drafted children it could take.
    D = int(t.depth.max())
    acc_len = np.array([c.accepted for c in cycles])
    reached_child = np.zeros((len(cycles), D + 1), dtype=bool)
    mass = np.zeros((len(cycles), D + 1))
    r = t.parent_accepted
    reached_child[t.cycle[r], t.depth[r]] = True
    np.add.at(mass, (t.cycle[r], t.depth[r]), t.token_prob[r])
    depths = np.arange(1, D + 1)
    reached = reached_child[:, 1:].sum(0)
    accepted = (acc_len[:, None] >= depths[None, :]).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        depth_rate = accepted / reached
        depth_pred = mass[:, 1:].sum(0) / reached
    return Reliability(kind, edges, count, mean_prob, rate, ece, n, len(cycles), depths, reached, accepted,
                       depth_rate, depth_pred)
