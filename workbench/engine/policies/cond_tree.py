"""CondTree: the N prefixes most likely accepted when each candidate is scored by the learned conditioned head."""
from __future__ import annotations

from dataclasses import dataclass

from ddtree_kernels.cond_tree import build_cond_tree
from ddtree_kernels.path_tree import path_tree_heap, rank_class
from workbench.engine.policies.base import register
from workbench.engine.policies.calibrated import check_budget
from workbench.engine.policies.conditioned import Conditioned, check_head_field


@register
@dataclass(frozen=True)
class CondTree(Conditioned):
    """A tree scored with the learned conditioned head (``cond_head``): candidate j of slot d under a parent at
    rank c of slot d - 1 adds log q, the head's estimate that j is the target's token given the drafter's hidden
    state at slot d and the parent's token. The tree holds the ``budget`` prefixes with the highest product of q
    (``PairTree``'s tree: ``path_tree`` with rank classes). Built as DDTree's is: under static shapes and off the
    CPU by the vectorised build (``ddtree_kernels.cond_tree``: over the batch, no Python per node, nothing read
    back from the device); on a CPU otherwise by the head scored in NumPy and the host heap, cheaper there. The
    two builds give the same tree from the same scores; the two scorings agree to float32 rounding.
    ``head``: 'dense', 'hybrid', a file, or None for the one shipped for the pair; a head trained on another pair
    is refused in one line before any decode."""

    budget: int = 32
    head: str | None = None
    kind = "condtree"
    usage = "condtree:N"
    knobs = ("budget",)
    batched_build = True  # its build takes a cycle's rows at once (the stage groups them)

    def __post_init__(self):
        check_budget("CondTree", self.budget)
        check_head_field("CondTree", self.head)

    def static_nodes(self, block_size: int) -> int:
        return self.budget + 1

    def build_tree(self, drafted, roots, sync_free):
        if sync_free or drafted.logprobs.device.type != "cpu":
            inc, topi = self.increments(drafted, roots, self.budget, sync_free)  # [bs, D, k, k], [bs, D, k]
            return build_cond_tree(inc, topi, roots, self.budget)
        inc, topi = self.host_increments(drafted, roots, self.budget)  # NumPy [bs, D, k, k], [bs, D, k]
        return path_tree_heap(inc, topi, roots, self.budget, rank_class, 0)
