"""DFlash: the drafter's argmax per slot, verified as a chain."""
from __future__ import annotations

from dataclasses import dataclass

from ddtree_kernels import chain_tree
from workbench.engine.policies.base import Policy, register


@register
@dataclass(frozen=True)
class DFlash(Policy):
    """Linear DFlash: the drafter's argmax per slot, verified as a chain."""

    kind = "dflash"
    usage = "dflash"

    def static_nodes(self, block_size: int) -> int:
        return block_size

    def build_tree(self, drafted, roots, sync_free):
        lp = drafted.logprobs  # [1, D, V]
        return chain_tree(lp.argmax(-1), roots, lp)

    def __str__(self) -> str:
        return "DFlash"
