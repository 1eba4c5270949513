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


def ancestor_hops(parents: Tensor, max_depth: int) -> Tensor:
    """[bs, n] parents -> int64 [bs, n, max_depth + 1]: [b, i, h] = the ancestor of i h levels up (hop 0 is i;
    past the root the hops stay at the root)."""
    bs, n = parents.shape
    up = parents.clamp(min=0)  # the root's parent is the root: walking past it adds nothing new
    hops = [torch.arange(n, device=parents.device).expand(bs, n)]
    for _ in range(max_depth):
        hops.append(up if len(hops) == 1 else up.gather(1, hops[-1]))
    return torch.stack(hops, dim=2)


def ancestor_matrix(parents: Tensor, max_depth: int) -> Tensor:
    """[bs, n] parents -> bool [bs, n, n] ancestor-or-self matrix."""
    bs, n = parents.shape
    vis = torch.zeros(bs, n, n, dtype=torch.bool, device=parents.device)
    return vis.scatter_(2, ancestor_hops(parents, max_depth), True)  # one write for every (node, ancestor)


def compile_tree(tree: Tree, start: Tensor | int, max_depth: int | None = None) -> CompiledTree:
    """Positions, visibility and EAGLE retrieve arrays of ``tree``; ``start`` is the root's position."""
    bs, n = tree.parents.shape
    device = tree.parents.device
    max_depth = n - 1 if max_depth is None else max_depth
    # A Python start is added as a scalar: making it a device tensor would be a host-to-device copy.
    positions = tree.depth + (start if isinstance(start, int) else start.reshape(-1, 1))
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
