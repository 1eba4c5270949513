"""Tree build: which drafted prefixes the target will verify, by policy."""
from __future__ import annotations

import torch

from ddtree_kernels import Tree, build_tree_from_topk, chain_tree
from workbench.policies import AR, DDTree, DFlash, Policy
from workbench.stages.draft import Draft


def tree_build(policy: Policy, drafted: Draft | None, root: int, device) -> Tree:
    """AR: the root alone; DFlash: the argmax chain; DDTree: the ``budget`` best prefixes."""
    roots = torch.tensor([root], device=device)
    if isinstance(policy, AR) or drafted is None or drafted.logprobs.shape[1] == 0:
        z = torch.zeros(1, 1, dtype=torch.long, device=device)
        return Tree(roots[:, None], z - 1, z, z.clone(), torch.zeros(1, 1, device=device))
    lp = drafted.logprobs
    if isinstance(policy, DFlash):
        return chain_tree(lp.argmax(-1), roots, lp)
    if isinstance(policy, DDTree):
        return build_tree_from_topk(*drafted.top(min(policy.budget, policy.width or policy.budget)), roots,
                                    policy.budget)
    raise TypeError(f"unknown policy {policy!r}")
