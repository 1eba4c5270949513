"""Spine: the drafter's argmax chain plus its ``siblings`` best runner-up tokens as leaves."""
from __future__ import annotations

from dataclasses import dataclass

from ddtree_kernels.spine_tree import spine_tree_from_topk
from workbench.engine.policies.base import MAX_BUDGET, Policy, register


@register
@dataclass(frozen=True)
class Spine(Policy):
    """DFlash's chain (the drafter's argmax per slot, the whole block deep) plus the ``siblings`` best
    tokens of rank >= 1 over all slots, each a leaf beside the chain's token at its slot
    (``ddtree_kernels.spine_tree``). ``Spine(0)`` verifies DFlash's chain."""

    siblings: int = 2
    kind = "spine"
    usage = "spine:K"
    knobs = ("siblings",)

    def __post_init__(self):
        k = self.siblings
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_BUDGET:
            raise ValueError(f"Spine siblings={k!r} must be an integer from 0 to {MAX_BUDGET} (e.g. Spine(2))")

    def static_nodes(self, block_size: int) -> int:
        return block_size + self.siblings  # the root, block_size - 1 drafts, the siblings

    def capacity(self, slots: int, vocab: int) -> int | None:
        runners_up = slots * (vocab - 1)
        return None if self.siblings <= runners_up else slots + runners_up

    def build_tree(self, drafted, roots, sync_free):
        return spine_tree_from_topk(*drafted.top(self.siblings + 1), roots, self.siblings)

    def __str__(self) -> str:
        return f"Spine({self.siblings})"
