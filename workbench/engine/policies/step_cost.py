"""A pair's measured step time as a small table: milliseconds per drafted cycle over (rows, tree nodes).

What a cycle of B rows with N-node trees costs: the drafter's block forward, the tree build and compile, the
target's verify of B x N tokens, accept, commit and the host's record. ``pays-off`` measures exactly these
stages per shape and batch (``workbench.payoff``) and ``sweep`` measures the verify over nodes x rows
(``workbench.bench.sweep``); a calibration file (``python -m workbench.calibrate --costs ...``) keeps a
table of them, and a policy reads it here as data (policies import neither).

Between measured points the table is read piecewise-linearly: in nodes at each measured row count, then in
rows (past the last measured point, along the last segment: a verify grows about linearly with its tokens
once the forward is compute-bound, which is what ``docs/pays-off.md`` measured from 17 nodes on). Measured
medians carry noise, so each row count's times are made non-decreasing in nodes when the table is read
(a 17-node verify measured a hair under a 16-node one costs the same, not less).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def interp(x: float, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """ys [len(xs), ...] read at x: linear between points, the last segment's line past the end, the first
    point's value before the start (a cost never falls below its smallest measured shape)."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    i = min(int(np.searchsorted(xs, x)), len(xs) - 1)  # the segment [i - 1, i] holds x, or the last one
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


@dataclass(frozen=True)
class StepCost:
    """Median ms of one drafted cycle: ``step_ms[i][j]`` at ``rows[i]`` rows and ``nodes[j]`` nodes per row
    (root included)."""

    rows: tuple  # increasing row counts
    nodes: tuple  # increasing node counts (root included)
    step_ms: tuple  # [len(rows)][len(nodes)]
    source: str = ""

    def __post_init__(self):
        table = np.maximum.accumulate(np.asarray(self.step_ms, dtype=np.float64), axis=1)
        object.__setattr__(self, "table", table)  # [rows, nodes], non-decreasing in nodes

    def ms(self, rows: int, nodes) -> np.ndarray:
        """Predicted ms of a cycle of ``rows`` rows verifying ``nodes`` nodes each (a number or an array)."""
        at_rows = interp(float(rows), np.asarray(self.rows, dtype=np.float64), self.table)  # [len(nodes grid)]
        xs = np.asarray(self.nodes, dtype=np.float64)
        n = np.atleast_1d(np.asarray(nodes, dtype=np.float64))
        out = np.array([interp(float(v), xs, at_rows) for v in n])
        return out if np.ndim(nodes) else out[0]

    def to_dict(self) -> dict:
        return {"rows": list(self.rows), "nodes": list(self.nodes), "step_ms": [list(r) for r in self.step_ms],
                "source": self.source}

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "StepCost":
        """From a calibration file's ``cost`` object; ValueError (one line) naming ``where`` if malformed."""
        fix = "a cost table is {rows: [...], nodes: [...], step_ms: [[ms per node count] per row count]}"
        try:
            rows, nodes = [int(r) for r in d["rows"]], [int(n) for n in d["nodes"]]
            ms = [[float(x) for x in r] for r in d["step_ms"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: its cost table is malformed; {fix}") from None
        if (not rows or not nodes or len(ms) != len(rows) or any(len(r) != len(nodes) for r in ms)
                or rows != sorted(set(rows)) or nodes != sorted(set(nodes)) or min(rows) < 1 or min(nodes) < 1
                or any(x <= 0 for r in ms for x in r)):
            raise ValueError(f"{where}: its cost table must list increasing rows and nodes (>= 1) and a positive "
                             f"ms for each pair; {fix}")
        return cls(tuple(rows), tuple(nodes), tuple(tuple(r) for r in ms), str(d.get("source", "")))
