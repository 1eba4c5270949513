"""Tree compile: every row's positions, visibility and retrieve arrays, as one ``TreeLayout``."""
from __future__ import annotations

from ddtree_kernels import Tree, compile_tree
from workbench.layout import TreeLayout


def tree_compile(trees: list[Tree], starts: list[int], max_depths: list[int]) -> TreeLayout:
    """Row b's tree is rooted at position ``starts[b]``; ``max_depths[b]`` bounds its ancestry walk."""
    compiled = [compile_tree(t, s, d) for t, s, d in zip(trees, starts, max_depths)]
    return TreeLayout.of_rows(trees, compiled, starts, max_depths)
