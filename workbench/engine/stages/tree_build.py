"""Tree build: which drafted prefixes the target will verify, by policy (``Policy.build_tree``)."""
from __future__ import annotations

import torch

from ddtree_kernels import Tree
from workbench.engine.policies import Policy
from workbench.engine.stages.draft import Draft


def tree_build(policy: Policy, drafted: Draft | None, root: int, device, sync_free: bool = False) -> Tree:
    """The root alone when nothing was drafted (AR, or no slot left); else the policy's own tree
    (``workbench.engine.policies``: DFlash's chain, DDTree's best prefixes, a TreePolicy's validated tree, ...).

    ``sync_free``: the build never waits for the device (static shapes / CUDA graphs)."""
    roots = torch.full((1,), root, dtype=torch.long, device=device)  # a fill, not a host-to-device copy
    if not policy.drafts or drafted is None or drafted.logprobs.shape[1] == 0:
        z = torch.zeros(1, 1, dtype=torch.long, device=device)
        return Tree(roots[:, None], z - 1, z, z.clone(), torch.zeros(1, 1, device=device))
    return policy.build_tree(drafted, roots, sync_free)
