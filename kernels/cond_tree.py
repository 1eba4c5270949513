"""The conditioned tree's build: the N best prefixes when a candidate's increment depends on its parent's rank
(a previous-token-conditioned score: ``ddtree_kernels.path_tree`` with ``rank_class``), vectorised over the batch.

inc [bs, D, k, k]: [b, d, j, c] = the log-probability increment of candidate j of slot d under a parent that is
candidate c of slot d - 1 (slot 0: the root, class 0). The tree and its node order are ``path_tree_heap(inc, topi,
roots, budget, rank_class, 0)``'s, by the same tie rule (score descending, then depth ascending, then the parent's
index ascending, then the candidate's position among its siblings, siblings by increment descending, equal
increments by rank ascending).

Per-depth beams, as DDTree's ``build_tree_vectorized``: every shape follows from (D, k, budget), nothing is read
back from the device (static shapes, CUDA graphs), and no Python runs per node. Only candidates that can make the
tree are formed. A node at slot d (depth d + 1) whose parent is entry p of slot d - 1's beam and which is the
j-th of that parent's children (sibling order) comes after the p + 1 beam entries up to its parent, its j better
siblings and its d - 1 other ancestors, so it is in the best ``budget`` only if p + j + d + 1 <= budget; likewise
slot d's beam keeps at most budget - d entries. So a depth forms fewer than budget x k candidates, and the loop
stops at depth ``budget``.
"""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from ddtree_kernels.tree_build import Tree, top_desc, tree_from_beams


@lru_cache(maxsize=512)
def plan(D: int, k: int, budget: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(beam sizes per slot, candidate pairs formed per slot), from the shapes alone. Slot 0's beam: its best
    min(k, budget) candidates; slot d's: at most budget - d entries, from the pairs p + j + d + 1 <= budget."""
    sizes, pairs = [min(k, budget)], [min(k, budget)]
    for d in range(1, min(D, budget)):
        n = sum(min(k, budget - d - p) for p in range(sizes[-1]) if budget - d - p > 0)
        if n == 0:
            break
        pairs.append(n)
        sizes.append(min(budget - d, n))
    return tuple(sizes), tuple(pairs)


@lru_cache(maxsize=512)
def pair_table(m: int, k: int, budget: int, d: int, offset: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(parent beam position p, p + ``offset`` (its entry among all depths'), sibling position j) of every candidate
    slot d forms, parent-major: row p holds j < min(k, budget - d - p). Made on the device from host shapes (no
    copy, no wait)."""
    counts = (budget - d - torch.arange(m, device=device)).clamp(min=0, max=k)  # [m]
    total = sum(min(k, max(0, budget - d - p)) for p in range(m))
    p = torch.repeat_interleave(torch.arange(m, device=device), counts, output_size=total)  # [total]
    starts = counts.cumsum(0) - counts
    return p, p + offset, torch.arange(total, device=device) - starts[p]


def build_cond_tree(inc: Tensor, topi: Tensor, root_tokens: Tensor, budget: int) -> Tree:
    """The ``budget`` best prefixes under rank-conditioned increments, as a Tree (root first, then nodes in the
    tie rule's order). inc [bs, D, k, k] (<= 0, float64 sums); topi [bs, D, k]; root_tokens [bs]."""
    bs, D, k, _ = inc.shape
    dev = inc.device
    # Siblings in the order a parent of class c meets them: [bs, D, c, position] increments and their ranks; a rank
    # is kept times k, the offset of the row its children read (class c's row starts at c * k).
    sinc, order = torch.sort(inc.permute(0, 1, 3, 2).double(), dim=-1, descending=True, stable=True)
    sinc, row_of = sinc.reshape(bs, D, k * k), (order * k).reshape(bs, D, k * k)  # [bs, D, class * k + position]
    sizes, _ = plan(D, k, budget)
    beam = sinc[:, 0, : sizes[0]]  # [bs, m0]: the root's class is 0
    row = row_of[:, 0, : sizes[0]]  # [bs, m0]: each entry's rank times k, where its children's increments start
    scores, parents, rows = [beam], [torch.full_like(row, -1)], [row]
    offset = 0
    for d in range(1, len(sizes)):
        p, entry, j = pair_table(sizes[d - 1], k, budget, d, offset, dev)  # [n] each
        at = row[:, p] + j  # [bs, n]: where each candidate's increment and rank sit in slot d's row
        cand = beam[:, p] + sinc[:, d].gather(1, at)  # [bs, n]
        pick = top_desc(cand, sizes[d])  # [bs, m_d]
        beam = cand.gather(1, pick)
        row = row_of[:, d].gather(1, at.gather(1, pick))
        scores.append(beam)
        parents.append(entry[pick])
        rows.append(row)
        offset += sizes[d - 1]
    ranks = [r // k for r in rows]  # [bs, m_d] each: a row offset's rank in its slot
    return tree_from_beams(root_tokens, topi, sizes, scores, parents, ranks, budget)
