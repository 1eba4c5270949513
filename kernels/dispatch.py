"""The one place where a kernel backend is chosen: ``torch`` (default) or ``sglang``."""
from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from ddtree_kernels.accept import Accepted, accept_walk
from ddtree_kernels.tree_build import Tree
from ddtree_kernels.tree_compile import CompiledTree

BACKENDS = ("torch", "sglang")


def check_backend(name: str) -> None:
    """Fail early, in one line, when a backend is unknown or not installed."""
    if name not in BACKENDS:
        raise ValueError(f"kernel_backend={name!r} is not one of {', '.join(BACKENDS)}")
    if name == "sglang":
        from ddtree_kernels.sglang_backend import INSTALL_HINT

        for mod in ("sglang", "triton"):
            if importlib.util.find_spec(mod) is None:
                raise RuntimeError(f"kernel_backend='sglang' needs the {mod!r} package; {INSTALL_HINT}")


def accept(backend: str, tree: Tree, compiled: CompiledTree, choice: Tensor, max_depth: int) -> Accepted:
    """Accept walk through the chosen backend. choice: [bs, n] target argmax or samples."""
    if backend == "torch":
        return accept_walk(tree.tokens, tree.parents, tree.depth, compiled.visibility, choice, max_depth)
    if backend == "sglang":
        from ddtree_kernels.sglang_backend import verify_tree_greedy

        bs, n = tree.tokens.shape
        index, num, predicts = verify_tree_greedy(
            tree.tokens, compiled.retrieve_index, compiled.retrieve_next_token,
            compiled.retrieve_next_sibling, choice, max_depth,
        )
        index = index.long()
        local = torch.where(index >= 0, index - torch.arange(bs, device=index.device)[:, None] * n, -1)
        num = num.long()
        last_row = index.gather(1, num[:, None])[:, 0]
        bonus = predicts.long()[last_row]
        return Accepted(local, num, bonus)
    check_backend(backend)
    raise AssertionError("unreachable")
