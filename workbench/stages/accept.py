"""Accept: walk the tree along the target's choices (torch kernel or SGLang's own)."""
from __future__ import annotations

from ddtree_kernels import Accepted, CompiledTree, Tree
from ddtree_kernels import accept as accept_kernel
from workbench.stages.verify import Verified


def accept(backend: str, tree: Tree, compiled: CompiledTree, verified: Verified, max_depth: int) -> Accepted:
    return accept_kernel(backend, tree, compiled, verified.choice, max_depth)
