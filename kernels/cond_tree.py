"""The conditioned tree's build: the N best prefixes when a candidate's increment depends on its parent's rank
(a previous-token-conditioned score: ``ddtree_kernels.path_tree`` with ``rank_class``), vectorised over the batch.

inc [bs, D, k, k]: [b, d, j, c] = the log-probability increment of candidate j of slot d under a parent that is
candidate c of slot d - 1 (slot 0: the root, class 0). The tree and its node order are ``path_tree_heap(inc, topi,
roots, budget, rank_class, 0)``'s, by the same tie rule (score descending, then depth ascending, then the parent's
index ascending, then the candidate's position among its siblings, siblings by increment descending, equal
increments by rank ascending).

Per-depth beams, as DDTree's ``build_tree_vectorized``: every shape follows from (D, k, budget), nothing is read
back from the device (static shapes, CUDA graphs), and no Python runs per node. A parent's children are formed in
rank order, all k of them, and never sorted: one stable sort per depth orders the candidates by score, then by
the parent's beam position, then by rank, which is the tie rule (equal scores among siblings are equal increments,
and those go by rank). Only parents that can have a child in the tree are expanded: a child of entry p of slot
d - 1's beam comes after the p + 1 beam entries up to its parent and its parent's d - 1 ancestors, so p + d + 1 <=
budget; likewise slot d's beam keeps at most budget - d entries, and the loop stops at depth ``budget``.
"""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from ddtree_kernels.tree_build import Tree, top_desc, tree_from_beams


@lru_cache(maxsize=512)
def plan(D: int, k: int, budget: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(beam sizes per slot, parents expanded per slot; slot 0's one parent is the root), from the shapes alone.
    Slot 0's beam: its best min(k, budget) candidates; slot d's: at most budget - d entries, from the k children
    of each of slot d - 1's first budget - d entries."""
    sizes, parents = [min(k, budget)], [1]
    for d in range(1, min(D, budget)):
        parents.append(min(sizes[-1], budget - d))
        sizes.append(min(budget - d, parents[-1] * k))
    return tuple(sizes), tuple(parents)


def build_cond_tree(inc: Tensor, topi: Tensor, root_tokens: Tensor, budget: int) -> Tree:
    """The ``budget`` best prefixes under rank-conditioned increments, as a Tree (root first, then nodes in the
    tie rule's order). inc [bs, D, k, k] (<= 0, float64 sums); topi [bs, D, k]; root_tokens [bs]."""
    bs, D, k, _ = inc.shape
    by_class = inc.transpose(2, 3).double()  # [bs, D, c, j]: a parent of class c's children, in rank order
    sizes, expanded = plan(D, k, budget)
    rank = top_desc(by_class[:, 0, 0], sizes[0])  # [bs, m0]: the root's class is 0
    beam = by_class[:, 0, 0].gather(1, rank)  # [bs, m0]
    scores, picks, ranks = [beam], [], [rank]
    for d in range(1, len(sizes)):
        m = expanded[d]
        children = by_class[:, d].gather(1, rank[:, :m, None].expand(bs, m, k))  # [bs, m, k]: each parent's row
        cand = (beam[:, :m, None] + children).reshape(bs, m * k)  # [bs, m * k]: parent-major, rank order
        pick = top_desc(cand, sizes[d])  # [bs, m_d]
        beam = cand.gather(1, pick)
        rank = pick % k
        scores.append(beam)
        picks.append(pick)
        ranks.append(rank)
    # Each pick's parent entry among all depths' (slot 0's: -1, the root), in one op after the loop.
    parents = [torch.full_like(ranks[0], -1)]
    if picks:
        parents.append(torch.cat(picks, dim=1) // k + entry_offsets(sizes, inc.device))
    return tree_from_beams(root_tokens, topi, sizes, scores, parents, ranks, budget)


@lru_cache(maxsize=512)
def entry_offsets(sizes: tuple, device: torch.device) -> Tensor:
    """[sum(sizes[1:])]: for every entry of slots 1.., where its parent slot's entries start among all slots'."""
    starts = [sum(sizes[:d - 1]) for d in range(1, len(sizes))]
    return torch.cat([torch.full((m,), s, dtype=torch.long, device=device) for m, s in zip(sizes[1:], starts)])
