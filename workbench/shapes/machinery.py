"""The per-step tree machinery: what a tree arm spends per decode step beyond its forwards (building the tree,
its attention metadata and masks, per-node recurrent state, the accept walk and the host round trip it needs),
per engine kind and graph mode.

    m = wb.shapes.machinery.FITTED
    m.share("vllm", "graphs")             # (0.375, "engine+graph"): seconds of machinery per second of step
    m.seconds(0.030, "vllm", "graphs")    # on a 30 ms step (forwards + per-step overhead): 11 ms
    wb.shapes.cost("qwen3-8b", engine="vllm", graph="graphs", ...).cycle_seconds(16)["machinery_s"]

The term is a **share of the tree arm's own step** (its drafter and verify forwards at its nodes and rows, plus
the per-step overhead it shares with the chain), because the part that dominates is per layer (a rebuilt
tensor, a tree recurrent-state kernel, a mask, a compaction for every layer) and runs on the same device as
the step, and the rest (tree build, accept walk) waits on it: a share carries from one model and GPU to another
where milliseconds do not. It scales with nodes and rows through that step. An explicit nodes x rows factor
on top of the share, fitted the same way, goes to zero on the published figures (see docs/cost-model.md).

Graph modes: ``graphs`` (the verify replays a CUDA graph: host work between replays stalls the GPU),
``eager`` (every op dispatched from Python: host work can hide in the launch gaps), ``compiled`` (a compiled
host loop, C++ / Rust / Metal, graph capture not stated). ``FITTED`` holds the shares fitted on every public
figure that publishes its reference arm's time (``workbench.shapes.published``, which also scores each
figure leave-one-source-out); ``tests/shapes/test_machinery.py`` refits them and fails if they drift.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

GRAPH_MODES = {"graphs": "CUDA graphs: host work between replays stalls the GPU",
               "eager": "every op dispatched from Python: host work can hide in the launch gaps",
               "compiled": "a compiled host loop (C++, Rust, Metal), graph capture not stated"}
NOT_PUBLISHED = "not published"
SHARE_GRID = tuple(i / 400 for i in range(801))  # shares tried by the fit: 0 to 2 in steps of 0.0025
LEVELS = ("engine+graph", "graph", "all")  # where a share comes from, most specific first
# Graph modes that say how host work meets the GPU; "compiled" (graph capture not stated) groups engines that
# share only a host language, so an engine no figure ran under it takes the share over all figures instead.
KNOWN_HOST_MODES = ("graphs", "eager")


@dataclass(frozen=True)
class TreeMachinery:
    """Seconds of tree machinery per second of the tree arm's step, per (engine kind, graph mode), with the
    share per graph mode and over all figures for an engine or mode no figure ran."""

    shares: Mapping = field(default_factory=dict)  # (engine, graph) -> share
    by_graph: Mapping = field(default_factory=dict)  # graph -> share
    overall: float = 0.0
    fitted_on: int = 0  # figures the shares were fitted on

    def share(self, engine: str, graph: str) -> tuple[float, str]:
        """The share for ``engine`` under ``graph`` and the level it comes from (``LEVELS``); the graph level
        only for a mode that says how host work meets the GPU (``KNOWN_HOST_MODES``)."""
        if (engine, graph) in self.shares:
            return self.shares[(engine, graph)], "engine+graph"
        if graph in self.by_graph and graph in KNOWN_HOST_MODES:
            return self.by_graph[graph], "graph"
        return self.overall, "all"

    def seconds(self, step_s: float, engine: str, graph: str, tree_steps: float = 1.0) -> float:
        """Machinery seconds per step on a tree step of ``step_s`` seconds (forwards + per-step overhead);
        ``tree_steps``: the share of steps that build a tree at all (a drafter that often proposes nothing)."""
        if not 0 < tree_steps <= 1:
            raise ValueError(f"tree_steps={tree_steps!r} is a share of steps in (0, 1]")
        return self.share(engine, graph)[0] * step_s * tree_steps

    def rows(self) -> list[dict]:
        """Every fitted share as {engine, graph, share}, engine "*" for a graph mode's and graph "*" for all."""
        out = [{"engine": e, "graph": g, "share": s} for (e, g), s in sorted(self.shares.items())]
        out += [{"engine": "*", "graph": g, "share": s} for g, s in sorted(self.by_graph.items())]
        return out + [{"engine": "*", "graph": "*", "share": self.overall}]


def fit_share(loss: Callable[[float], float], grid: Sequence[float] = SHARE_GRID) -> float:
    """The share on ``grid`` that minimises ``loss`` (a sum of |log(predicted / published)|, so each figure
    pulls as a median does, not as a mean); where several tie, the median of them."""
    costs = [(loss(s), s) for s in grid]
    best = min(c for c, _ in costs)
    return statistics.median(s for c, s in costs if c <= best + 1e-12)


def fit(rows: Sequence, loss: Callable[[Sequence, float], float]) -> TreeMachinery:
    """Shares fitted on ``rows`` (objects with ``engine`` and ``graph``): one per (engine, graph), per graph
    and over all, each on the rows it covers. ``loss(rows, share)``: the sum of |log error| of those rows'
    predictions at that share. No row outside ``rows`` is read, so a held-out figure never fits itself."""
    rows = list(rows)
    if not rows:
        return TreeMachinery()
    keys = sorted({(r.engine, r.graph) for r in rows})
    shares = {k: fit_share(lambda s, k=k: loss([r for r in rows if (r.engine, r.graph) == k], s)) for k in keys}
    graphs = sorted({r.graph for r in rows})
    by_graph = {g: fit_share(lambda s, g=g: loss([r for r in rows if r.graph == g], s)) for g in graphs}
    return TreeMachinery(shares, by_graph, fit_share(lambda s: loss(rows, s)), len(rows))


def log_error(predicted: float, published: float) -> float:
    """|log(predicted / published)|: the fit's loss for one figure (an error of +x and of 1 / (1 + x) - 1
    weigh the same)."""
    return abs(math.log(predicted / published))


# Fitted by workbench.shapes.published.fit_all() on the 31 public figures that publish their reference arm's
# time (python -m workbench.shapes.published prints them; tests/shapes/test_machinery.py refits and compares).
FITTED = TreeMachinery(
    shares={("ggml", "compiled"): 0.365, ("hipfire", "compiled"): 0.08375, ("mlx", "compiled"): 0.8375,
            ("transformers", "eager"): 0.0025, ("vllm", "eager"): 0.36375, ("vllm", "graphs"): 0.375},
    by_graph={"compiled": 0.1, "eager": 0.0225, "graphs": 0.375},
    overall=0.175,
    fitted_on=31,
)

__all__ = ["FITTED", "GRAPH_MODES", "KNOWN_HOST_MODES", "LEVELS", "NOT_PUBLISHED", "SHARE_GRID", "TreeMachinery", "fit",
           "fit_share", "log_error"]
