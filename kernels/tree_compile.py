"""Tree compile: what the target's verify forward and the accept walk need from a tree.

Positions are depth-based (siblings share a position), visibility is the
ancestor-or-self relation, and the EAGLE retrieve arrays let SGLang's tree-verify
kernel walk the tree.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels.tree_build import Tree


@dataclass(frozen=True)
class CompiledTree:
    positions: Tensor  # int64 [bs, n]: start + depth
    visibility: Tensor  # bool [bs, n, n]: [i, j] = node j is an ancestor of i, or i itself
    retrieve_index: Tensor  # int64 [bs, n]: flat row b*n + i
    retrieve_next_token: Tensor  # int64 [bs, n]: first child (lowest index) or -1
    retrieve_next_sibling: Tensor  # int64 [bs, n]: next child of the same parent or -1


def ancestor_matrix(parents: Tensor, max_depth: int) -> Tensor:
    """[bs, n] parents -> bool [bs, n, n] ancestor-or-self matrix."""
    bs, n = parents.shape
    vis = torch.eye(n, dtype=torch.bool, device=parents.device).expand(bs, n, n).clone()
    anc = parents.clone()
    for _ in range(max_depth):
        # The root (index 0) is every node's ancestor, so clamping -1 to 0 writes only true entries.
        vis.scatter_(2, anc.clamp(min=0)[..., None], True)
        anc = parents.gather(1, anc.clamp(min=0))
    return vis


def compile_tree(tree: Tree, start: Tensor | int, max_depth: int | None = None) -> CompiledTree:
    """Positions, visibility and EAGLE retrieve arrays of ``tree``; ``start`` is the root's position."""
    bs, n = tree.parents.shape
    device = tree.parents.device
    max_depth = n - 1 if max_depth is None else max_depth
    start_t = torch.as_tensor(start, device=device).reshape(-1, 1)
    positions = start_t + tree.depth
    visibility = ancestor_matrix(tree.parents, max_depth)

    idx = torch.arange(n, device=device).expand(bs, n)
    retrieve_index = idx + torch.arange(bs, device=device)[:, None] * n
    # First child = smallest child index; children of node i are the j with parents[j] == i.
    first = torch.full((bs, n + 1), n, dtype=torch.long, device=device)
    first.scatter_reduce_(1, tree.parents[:, 1:] + 1, idx[:, 1:], reduce="amin", include_self=True)
    next_token = first[:, 1:]
    next_token = torch.where(next_token == n, -1, next_token)
    # Next sibling: order nodes by (parent, index); a node's successor with the same parent.
    order = torch.sort(tree.parents, dim=1, stable=True).indices  # [bs, n]
    par_sorted = tree.parents.gather(1, order)
    same = par_sorted[:, 1:] == par_sorted[:, :-1]
    succ = torch.where(same, order[:, 1:], -1)
    next_sibling = torch.full((bs, n), -1, dtype=torch.long, device=device)
    next_sibling.scatter_(1, order[:, :-1], succ)
    return CompiledTree(positions, visibility, retrieve_index, next_token, next_sibling)
