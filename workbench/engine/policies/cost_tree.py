"""CostTree: each cycle's node count chosen to maximise expected committed tokens per predicted step time."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.engine.policies.base import register
from workbench.engine.policies.calibrated import (Calibrated, check_budget, check_calibration_field, first_nodes,
                                                  rows_of)
from workbench.engine.policies.step_cost import StepCost


def budget_for(scores: np.ndarray, rows: int, cost: StepCost) -> int:
    """How many of a best-first tree's drafted nodes to verify.

    scores [n]: the drafted nodes' estimated path log-acceptance, in node order (non-increasing). The first m
    nodes commit 1 + sum(exp(scores[:m])) tokens in expectation (each node counts when its whole path is
    accepted; the bonus always); a cycle of ``rows`` rows verifying m + 1 nodes each costs ``cost.ms(rows,
    m + 1)``. -> the m in 1..n with the most expected tokens per ms (the smallest such m on a tie)."""
    n = len(scores)
    if n <= 1:
        return n
    expected = 1.0 + np.cumsum(np.exp(np.asarray(scores, dtype=np.float64)))  # [n]: m = 1..n
    rate = expected / cost.ms(rows, np.arange(2, n + 2))
    return int(np.argmax(rate)) + 1  # argmax takes the first of equal maxima


@register
@dataclass(frozen=True)
class CostTree(Calibrated):
    """A budget chosen per cycle from cost (CaDDTree-like): of the path-conditioned tree's ``budget`` best
    nodes (``PathTree``), verify the first m, m maximising expected committed tokens / predicted step time at
    this cycle's batch size, from the pair's measured step cost over rows x nodes in its calibration file.

    The expected tokens come from this cycle's own path estimates, so a confident draft gets a deep tree and
    an uncertain one a small tree; the cost comes from the current rows, so the same policy verifies fewer
    nodes at batch 8 (where each node costs 8 tokens of verify) than at batch 1. Under static shapes (CUDA
    graphs) every verify is padded to ``budget + 1`` nodes anyway and reading the scores would wait for the
    device, so there it verifies the whole ``budget``."""

    budget: int = 64
    calibration: str | None = None
    kind = "costed"
    usage = "costed:N"
    knobs = ("budget",)
    batched_build = True  # its build takes a cycle's rows at once (the stage groups them)

    def __post_init__(self):
        check_budget("CostTree", self.budget)
        check_calibration_field("CostTree", self.calibration)

    def check_calibration(self, cal, pair=None) -> None:
        cal.step_cost()  # refuses a file without a cost table, before any decode

    def static_nodes(self, block_size: int) -> int:
        return self.budget + 1

    def build_tree(self, drafted, roots, sync_free):
        return self.build_rows(drafted, roots, sync_free)[0]

    def build_rows(self, drafted, roots, sync_free):
        tree = self.likely_tree(drafted, roots, self.budget, None, sync_free)  # [n, budget + 1]
        rows = [tree[b] for b in range(tree.tokens.shape[0])]
        if sync_free:
            return rows
        cost, batch = self.calibration_data().step_cost(), rows_of(drafted)
        scores = tree.score[:, 1:].numpy()  # [n, budget]
        return [first_nodes(r, budget_for(scores[b], batch, cost)) for b, r in enumerate(rows)]
