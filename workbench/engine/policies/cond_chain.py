"""CondChain: one coherent chain picked from the drafter's per-slot top-k with the learned conditioned head."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from workbench.engine.policies.base import register
from workbench.engine.policies.calibrated import check_budget
from workbench.engine.policies.conditioned import Conditioned, check_head_field
from workbench.engine.policies.pair_chain import chain_scores, chain_tree


def longest_chain(inc: Tensor) -> tuple[Tensor, Tensor]:
    """The chain with the most expected accepted tokens when each increment is a log-probability of acceptance
    given the path above (the learned head's q): E = q1 (1 + q2 (1 + q3 (...))), maximised slot by slot from the
    last (the Viterbi path maximises q1 q2 ... qD, the chance of accepting all of it, instead).

    inc [bs, D, k, k]: [b, d, j, c] = log q of candidate j of slot d after candidate c of slot d - 1 (slot 0: the
    same for every c). -> (chosen ranks [bs, D], the chain's cumulative log q [bs, D]). Tensor steps only."""
    bs, D, k, _ = inc.shape
    q = inc.exp()  # [bs, D, j, c]
    value = torch.zeros(bs, k, dtype=q.dtype, device=q.device)  # [bs, j]: expected tokens after candidate j
    back = []
    for d in range(D - 1, -1, -1):
        value, arg = (q[:, d] * (1 + value[:, :, None])).max(dim=1)  # [bs, c]: the best j after each parent c
        back.append(arg)
    ranks = [back[-1][:, 0]]  # slot 0: under the root (class 0)
    for arg in reversed(back[:-1]):
        ranks.append(arg.gather(1, ranks[-1][:, None])[:, 0])
    ranks = torch.stack(ranks, dim=1)  # [bs, D]
    return ranks, chain_scores(inc, ranks)


@register
@dataclass(frozen=True)
class CondChain(Conditioned):
    """One chain, verified like DFlash's, picked from the drafter's per-slot top-``width`` as the sequence with
    the most expected accepted tokens under the learned head's q (``cond_head``; ``longest_chain``). ``width`` 1 is
    DFlash's argmax chain."""

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
        return chain_tree(inc, topi, roots, longest_chain)
