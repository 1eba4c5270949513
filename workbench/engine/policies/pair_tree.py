"""PairTree: the N prefixes most likely accepted when each candidate is scored given its parent's token."""
from __future__ import annotations

from dataclasses import dataclass

from ddtree_kernels.path_tree import path_tree, rank_class
from ddtree_kernels.tree_build import sorted_slots
from workbench.engine.policies.base import register
from workbench.engine.policies.calibrated import Calibrated, check_budget, check_calibration_field
from workbench.engine.policies.pair_head import conditioned_increments


@register
@dataclass(frozen=True)
class PairTree(Calibrated):
    """A tree scored with a previous-token-conditioned head (TreeFlash-like): candidate j of slot d under a
    parent with token p adds log q = log of the drafter's candidate mass redistributed by
    p_drafter(c_j) * p_head(c_j | p) ** beta (``pair_head``), so a sibling's children are ranked for the sibling,
    not for the drafter's own argmax. The tree holds the ``budget`` prefixes with the highest product of q
    (``ddtree_kernels.path_tree`` with rank classes). The head and ``beta`` come from the pair's calibration
    (``calibration``: 'dense', 'hybrid', a file, or None for the one shipped for the pair); a head made with
    another tokenizer is refused in one line before any decode."""

    budget: int = 32
    calibration: str | None = None
    kind = "pairtree"
    usage = "pairtree:N"
    knobs = ("budget",)
    batched_build = True  # its build takes a cycle's rows at once (the stage groups them)

    def __post_init__(self):
        check_budget("PairTree", self.budget)
        check_calibration_field("PairTree", self.calibration)

    def check_calibration(self, cal, pair=None) -> None:
        cal.head(pair)

    def static_nodes(self, block_size: int) -> int:
        return self.budget + 1

    def build_tree(self, drafted, roots, sync_free):
        cal = self.calibration_data()
        head, beta = cal.head()
        lp = drafted.logprobs  # [1, D, V]
        k = min(self.budget, cal.width, lp.shape[-1])
        topv, topi = sorted_slots(lp, k) if sync_free else drafted.top(k)  # [1, D, k]
        inc = conditioned_increments(head, topv, topi, roots, beta)  # [1, D, k, k]
        return path_tree(inc, topi, roots, self.budget, sync_free, rank_class, 0)
