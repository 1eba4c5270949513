"""CutTree: verify only what is likely: the tree (or the chain) cut where its estimated acceptance falls
below a threshold."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.engine.policies.base import register
from workbench.engine.policies.calibrated import (Calibrated, check_budget, check_calibration_field, first_nodes,
                                                  rows_of)


def kept_nodes(scores: np.ndarray, threshold: float) -> int:
    """How many of a best-first tree's drafted nodes have an estimated path acceptance >= ``threshold``
    (scores [n]: path log-acceptance in node order, non-increasing; so the kept ones are a prefix, and a prefix
    of the node order is a tree). At least one: a drafted cycle verifies something."""
    s = np.asarray(scores, dtype=np.float64)
    return max(1, int(np.sum(s >= math.log(threshold)))) if s.size else 0


@register
@dataclass(frozen=True)
class CutTree(Calibrated):
    """Verify only what is likely (DSpark-like): the path-conditioned tree of ``budget`` nodes (``width=1``: the
    drafter's chain), cut per row at the first node whose estimated whole-path acceptance is below
    ``threshold``. A batch's verify is as wide as its widest row, so confident rows set it and uncertain ones
    verify a few nodes.

    ``threshold`` in (0, 1); None: the one chosen on the calibration prompts (``python -m workbench.calibrate``
    picks, per shape and batch size, the threshold with the most committed tokens per predicted ms), for the
    measured batch size nearest this cycle's. Under static shapes (CUDA graphs) the verify is padded to
    ``budget + 1`` nodes anyway and the cut would wait for the device: there the whole tree is verified."""

    budget: int = 16
    threshold: float | None = None
    width: int | None = None
    calibration: str | None = None
    kind = "cut"
    usage = "cut:N:T"
    knobs = ("budget", "width")
    batched_build = True  # its build takes a cycle's rows at once (the stage groups them)

    def __post_init__(self):
        check_budget("CutTree", self.budget)
        t = self.threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 < t < 1.0):
            raise ValueError(f"CutTree threshold={t!r} must be a number in (0, 1), e.g. CutTree(16, threshold=0.2); "
                             "None takes the one chosen on the calibration prompts")
        w = self.width
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"CutTree width={w!r} must be a positive integer or None")
        check_calibration_field("CutTree", self.calibration)

    @property
    def shape(self) -> str:
        """Which calibrated threshold applies: the chain's or the tree's."""
        return "chain" if self.width == 1 else "tree"

    def check_calibration(self, cal, pair=None) -> None:
        if self.threshold is None:
            cal.threshold(self.shape, 1)  # refuses a file without one, before any decode

    def static_nodes(self, block_size: int) -> int:
        return self.budget + 1

    def build_tree(self, drafted, roots, sync_free):
        return self.build_rows(drafted, roots, sync_free)[0]

    def build_rows(self, drafted, roots, sync_free):
        tree = self.likely_tree(drafted, roots, self.budget, self.width, sync_free)  # [n, budget + 1]
        rows = [tree[b] for b in range(tree.tokens.shape[0])]
        if sync_free:
            return rows
        t = self.threshold if self.threshold is not None else \
            self.calibration_data().threshold(self.shape, rows_of(drafted))
        scores = tree.score[:, 1:].numpy()  # [n, budget]
        return [first_nodes(r, kept_nodes(scores[b], t)) for b, r in enumerate(rows)]
