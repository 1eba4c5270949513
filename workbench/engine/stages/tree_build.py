"""Tree build: which drafted prefixes the target will verify, by policy (``Policy.build_tree``)."""
from __future__ import annotations

import torch

from ddtree_kernels import InvalidTree, Tree
from workbench.engine.policies import Policy
from workbench.engine.stages.draft import Draft
from workbench.engine.stages.tree_check import TreeCheck, at_row, check_trees


def tree_build_rows(policies: list[Policy], drafted: list[Draft | None], roots: list[int], device,
                    sync_free: bool = False) -> list[Tree]:
    """Every row's tree (``tree_build`` each). Rows of one policy that builds several rows at once
    (``Policy.batched_build``) with drafts of one depth are built in one call: the same trees, with one set
    of tensor calls for the rows instead of one per row (what a batch's tree build costs on a host)."""
    groups: dict[tuple, list[int]] = {}
    for b, (p, d) in enumerate(zip(policies, drafted)):
        if p.batched_build and p.drafts and d is not None and d.logprobs.shape[1] > 0:
            groups.setdefault((p, d.logprobs.shape[1]), []).append(b)
    trees: list[Tree | None] = [None] * len(policies)
    for (p, _), rows in groups.items():
        if len(rows) > 1:
            together = p.build_rows(Draft.stack([drafted[b] for b in rows]),
                                    torch.cat([torch.full((1,), roots[b], dtype=torch.long, device=device)
                                               for b in rows]),  # fills, not a host-to-device copy
                                    sync_free)
            for b, t in zip(rows, together):
                trees[b] = t
    for b, (p, d, r) in enumerate(zip(policies, drafted, roots)):
        if trees[b] is None:
            try:
                trees[b] = tree_build(p, d, r, device, sync_free)
            except InvalidTree as e:  # a checked build's one-row tree: its row in this cycle, not "batch 0"
                raise at_row(e, b if len(policies) > 1 else None) from None
    return trees


def tree_build_checked(policies: list[Policy], drafted: list[Draft | None], roots: list[int], device,
                       sync_free: bool = False, nodes: int | None = None) -> tuple[list[Tree], TreeCheck | None]:
    """Every row's tree (``tree_build_rows``), each one a policy built checked before anything verifies it
    (``workbench.engine.stages.tree_check``: the rows at once; its depth bound is the row's drafted slots, its
    vocabulary the drafter's): a bad tree raises InvalidTree naming the policy and, in a batch, the row; for
    device trees and under ``sync_free`` the check comes back as a ``TreeCheck`` for the commit's host read.
    ``nodes``: every tree's node bound (static shapes)."""
    trees = tree_build_rows(policies, drafted, roots, device, sync_free)
    checked = [(b, f"the tree {p} built", r, d.logprobs.shape[-1], d.logprobs.shape[1])
               for b, (p, d, r) in enumerate(zip(policies, drafted, roots))
               if p.drafts and d is not None and d.logprobs.shape[1] > 0]
    if not checked:  # root-only trees (AR, no slot left): the stage made them itself
        return trees, None
    return check_trees(trees, checked, nodes, sync_free)


def tree_build(policy: Policy, drafted: Draft | None, root: int, device, sync_free: bool = False) -> Tree:
    """The root alone when nothing was drafted (AR, or no slot left); else the policy's own tree
    (``workbench.engine.policies``: DFlash's chain, DDTree's best prefixes, a TreePolicy's validated tree, ...).

    ``sync_free``: the build never waits for the device (static shapes / CUDA graphs)."""
    roots = torch.full((1,), root, dtype=torch.long, device=device)  # a fill, not a host-to-device copy
    if not policy.drafts or drafted is None or drafted.logprobs.shape[1] == 0:
        z = torch.zeros(1, 1, dtype=torch.long, device=device)
        return Tree(roots[:, None], z - 1, z, z.clone(), torch.zeros(1, 1, device=device))
    return policy.build_tree(drafted, roots, sync_free)
