"""CondChain: one coherent chain picked from the drafter's per-slot top-k with the learned conditioned head."""
from __future__ import annotations

from dataclasses import dataclass

from workbench.engine.policies.base import register
from workbench.engine.policies.calibrated import check_budget
from workbench.engine.policies.conditioned import Conditioned, check_head_field
from workbench.engine.policies.pair_chain import chain_tree


@register
@dataclass(frozen=True)
class CondChain(Conditioned):
    """One chain, verified like DFlash's, picked from the drafter's per-slot top-``width`` as the sequence with
    the highest product of the learned head's q (``cond_head``; the Viterbi path of ``pair_chain.best_chain``).
    ``width`` 1 is DFlash's argmax chain."""

    width: int = 8
    head: str | None = None
    kind = "condchain"
    usage = "condchain:W"
    knobs = ("width",)

    def __post_init__(self):
        check_budget("CondChain", self.width, "width")
        check_head_field("CondChain", self.head)

    def static_nodes(self, block_size: int) -> int:
        return block_size

    def capacity(self, slots: int, vocab: int) -> int | None:
        return None  # a chain as deep as the block, whatever the width

    def build_tree(self, drafted, roots, sync_free):
        inc, topi = self.increments(drafted, roots, self.width, sync_free)  # [bs, D, k, k], [bs, D, k]
        return chain_tree(inc, topi, roots)
