"""Tree build: which drafted prefixes the target will verify, by policy."""
from __future__ import annotations

import torch

from ddtree_kernels import Tree, build_tree_from_topk, chain_tree, validate_tree
from ddtree_kernels.eagle_tree import build_eagle_tree
from ddtree_kernels.tree_build import build_tree_vectorized, sorted_slots
from workbench.engine.policies import AR, DDTree, DFlash, EagleTree, Policy, TreePolicy
from workbench.engine.stages.draft import Draft


def tree_build(policy: Policy, drafted: Draft | None, root: int, device, sync_free: bool = False) -> Tree:
    """AR: the root alone; DFlash: the argmax chain; DDTree: the ``budget`` best prefixes;
    EagleTree: SGLang's top-k-per-step tree; TreePolicy: the user's function, validated.

    ``sync_free``: DDTree takes the device build on every device (the same tree; on a CPU the heap
    build is cheaper but reads the top-k on the host)."""
    roots = torch.full((1,), root, dtype=torch.long, device=device)  # a fill, not a host-to-device copy
    if isinstance(policy, AR) or drafted is None or drafted.logprobs.shape[1] == 0:
        z = torch.zeros(1, 1, dtype=torch.long, device=device)
        return Tree(roots[:, None], z - 1, z, z.clone(), torch.zeros(1, 1, device=device))
    lp = drafted.logprobs
    if isinstance(policy, DFlash):
        return chain_tree(lp.argmax(-1), roots, lp)
    if isinstance(policy, DDTree) and sync_free:
        k = min(policy.budget, policy.width or policy.budget, lp.shape[-1])
        return build_tree_vectorized(*sorted_slots(lp, k), roots, policy.budget)
    if isinstance(policy, DDTree):
        return build_tree_from_topk(*drafted.top(min(policy.budget, policy.width or policy.budget)), roots,
                                    policy.budget)
    if isinstance(policy, EagleTree):
        # Near the end of a generation fewer slots are drafted: the tree gets shallower, not invalid.
        steps = min(policy.steps, lp.shape[1])
        k = policy.topk
        n = min(policy.num_draft_tokens, 1 + k + (steps - 1) * k * k)
        return build_eagle_tree(lp, roots, k, steps, n)
    if isinstance(policy, TreePolicy):
        tree = policy.build(lp, roots, policy.budget)
        validate_tree(tree, policy.budget, lp.shape[-1], roots, lp.shape[1], who=f"TreePolicy {policy.name!r}")
        return tree
    raise TypeError(f"unknown policy {policy!r}")
