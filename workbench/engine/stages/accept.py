"""Accept: walk every row's tree along the target's choices (torch kernel or SGLang's own)."""
from __future__ import annotations

from ddtree_kernels import Accepted
from ddtree_kernels import accept as accept_kernel
from workbench.models.layout import TreeLayout
from workbench.engine.stages.verify import Verified


def accept(backend: str, layout: TreeLayout, verified: Verified) -> Accepted:
    return accept_kernel(backend, layout.tree, layout.compiled, verified.choice, layout.max_depth)
