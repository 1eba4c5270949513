"""Tree compile: positions, visibility and retrieve arrays for verify and accept."""
from __future__ import annotations

from ddtree_kernels import CompiledTree, Tree, compile_tree


def tree_compile(tree: Tree, start: int, max_depth: int) -> CompiledTree:
    return compile_tree(tree, start, max_depth)
