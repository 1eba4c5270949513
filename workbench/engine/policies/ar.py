"""AR: plain target decoding, one token per cycle, no drafter (the baseline)."""
from __future__ import annotations

from dataclasses import dataclass

from workbench.engine.policies.base import Policy, register


@register
@dataclass(frozen=True)
class AR(Policy):
    """Plain target decoding: one token per cycle, no drafter (the baseline)."""

    kind = "ar"
    usage = "ar"
    drafts = False  # the tree is the root alone: the tree build stage never asks this policy

    def static_nodes(self, block_size: int) -> int:
        return 1

    def __str__(self) -> str:
        return "AR"
