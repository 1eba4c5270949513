"""PairChain: one coherent chain picked from the drafter's per-slot top-k with a previous-token-conditioned head."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels import Tree
from ddtree_kernels.tree_build import sorted_slots
from workbench.engine.policies.base import register
from workbench.engine.policies.calibrated import Calibrated, check_budget, check_calibration_field
from workbench.engine.policies.pair_head import conditioned_increments


def best_chain(inc: Tensor) -> tuple[Tensor, Tensor]:
    """The candidate per slot with the highest summed increment along the chain (Viterbi over parent classes).

    inc [bs, D, k, k]: [b, d, j, c] = log q of candidate j of slot d after candidate c of slot d - 1 (slot 0: the
    same for every c). -> (chosen ranks [bs, D], the chain's cumulative scores [bs, D]). Tensor steps only: it
    reads nothing from the device."""
    bs, D, k, _ = inc.shape
    best = inc[:, 0, :, 0]  # [bs, k]: the best chain ending in candidate j of slot 0
    back = []
    for d in range(1, D):
        cand = best[:, None, :] + inc[:, d]  # [bs, j, c]
        best, arg = cand.max(dim=-1)  # [bs, k]: max over the previous candidate (first index on ties)
        back.append(arg)
    last = best.argmax(dim=-1)  # [bs]
    ranks = [last]
    for arg in reversed(back):
        ranks.append(arg.gather(1, ranks[-1][:, None])[:, 0])
    ranks = torch.stack(ranks[::-1], dim=1)  # [bs, D]
    return ranks, chain_scores(inc, ranks)


def chain_scores(inc: Tensor, ranks: Tensor) -> Tensor:
    """The cumulative increments [bs, D] along the chain that takes candidate ranks[b, d] at slot d."""
    bs, D, k, _ = inc.shape
    prev = torch.cat([torch.zeros_like(ranks[:, :1]), ranks[:, :-1]], dim=1)  # slot 0's class: any (0)
    steps = inc.gather(2, ranks[:, :, None, None].expand(bs, D, 1, k))[:, :, 0, :].gather(2, prev[:, :, None])[:, :, 0]
    return steps.cumsum(1)


def chain_tree(inc: Tensor, topi: Tensor, roots: Tensor, pick=best_chain) -> Tree:
    """The chain ``pick`` chooses from ``inc`` [bs, D, k, k] (default: the Viterbi chain) as a tree: the root, then one
    candidate per slot (topi [bs, D, k] their ids; roots [bs])."""
    ranks, score = pick(inc)  # [bs, D] each
    bs, D = ranks.shape
    idx = torch.arange(D + 1, device=ranks.device).expand(bs, D + 1)
    zero = torch.zeros(bs, 1, dtype=torch.long, device=ranks.device)
    return Tree(tokens=torch.cat([roots.reshape(bs, 1).long(), topi.gather(2, ranks[:, :, None])[:, :, 0]], dim=1),
                parents=idx - 1, depth=idx.clone(), rank=torch.cat([zero, ranks], dim=1),
                score=torch.cat([zero.double(), score], dim=1))


@register
@dataclass(frozen=True)
class PairChain(Calibrated):
    """One chain, verified like DFlash's, but picked from the drafter's per-slot top-``width`` as the sequence
    with the highest product of head-rescored probabilities (DFlash2-like: a selector scores adjacent
    candidate pairs; here the previous-token-conditioned head of the pair's calibration, ``pair_head``).
    ``width`` 1 is DFlash's argmax chain."""

    width: int = 8
    calibration: str | None = None
    kind = "pairchain"
    usage = "pairchain:W"
    knobs = ("width",)

    def __post_init__(self):
        check_budget("PairChain", self.width, "width")
        check_calibration_field("PairChain", self.calibration)

    def check_calibration(self, cal, pair=None) -> None:
        cal.head(pair)

    def static_nodes(self, block_size: int) -> int:
        return block_size

    def capacity(self, slots: int, vocab: int) -> int | None:
        return None  # a chain as deep as the block, whatever the width

    def build_tree(self, drafted, roots, sync_free):
        cal = self.calibration_data()
        head, beta = cal.head()
        lp = drafted.logprobs  # [1, D, V]
        k = min(self.width, cal.width, lp.shape[-1])
        topv, topi = sorted_slots(lp, k) if sync_free else drafted.top(k)  # [1, D, k]
        return chain_tree(conditioned_increments(head, topv, topi, roots, beta), topi, roots)
