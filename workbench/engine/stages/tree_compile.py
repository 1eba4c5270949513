"""Tree compile: every row's positions, visibility and retrieve arrays, as one ``TreeLayout``."""
from __future__ import annotations

from ddtree_kernels import Tree, compile_tree
from workbench.models.layout import TreeLayout


def tree_compile(trees: list[Tree], starts: list[int], max_depths: list[int], nodes: int | None = None) -> TreeLayout:
    """Row b's tree is rooted at position ``starts[b]``; ``max_depths[b]`` bounds its ancestry walk.
    ``nodes``: pad every row to this many nodes (static shapes); default: to the largest tree."""
    # A tree on the CPU (the heap build's) tells its real depth for free: the ancestry walk then takes as
    # many steps as the tree is deep, not as the drafted block is long. A device tree keeps the bound
    # (reading its depth would wait for the device).
    max_depths = [min(d, int(t.depth.max())) if t.depth.device.type == "cpu" and nodes is None else d
                  for t, d in zip(trees, max_depths)]
    compiled = [compile_tree(t, s, d) for t, s, d in zip(trees, starts, max_depths)]
    return TreeLayout.of_rows(trees, compiled, starts, max_depths, nodes)
