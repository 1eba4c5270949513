"""``TreeLayout``: the trees of one cycle, all rows together, as the verify forward and the accept walk read them.

Architecture-free: which tokens at which positions, who is whose parent and ancestor, where each row's
tree is rooted. Built once per cycle by ``stages.tree_compile``; every model state takes its own inputs
from it (a dense state its mask, a recurrent state its forks).

One row (B = 1) is the row's own tree and compiled tree, unpadded and uncopied. With B > 1 the trees
are padded to a common node count N with inert nodes (token -1, parent -1, position = the root's,
seeing only themselves), which no accept walk can take.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ddtree_kernels import CompiledTree, Tree
from ddtree_kernels.tree_compile import ancestor_hops


@dataclass
class TreeLayout:
    tree: Tree  # [B, N]: tokens (-1 on padding), parents, depth, rank, score
    compiled: CompiledTree  # positions [B, N], visibility [B, N, N], retrieve arrays [B, N]
    starts: list[int]  # host: row b's root position (= its committed length)
    n: list[int]  # host: row b's real node count (root included); padding fills up to N
    max_depth: int  # deepest node over all rows (0: every tree is a root alone)
    trees: list[Tree]  # row b's own tree, [1, n_b] (what its Cycle record keeps)
    compileds: list[CompiledTree]  # row b's own compiled tree
    _hops: Tensor | None = field(default=None, repr=False)

    @property
    def B(self) -> int:
        return len(self.starts)

    @property
    def N(self) -> int:
        return self.tree.n

    @property
    def padded(self) -> bool:
        return any(n != self.N for n in self.n)

    @property
    def tokens(self) -> Tensor:
        """int64 [B, N] input ids: padding nodes read token 0 (their -1 is for the accept walk only)."""
        return self.tree.tokens.clamp(min=0) if self.padded else self.tree.tokens

    @property
    def positions(self) -> Tensor:
        return self.compiled.positions

    @property
    def visibility(self) -> Tensor:
        return self.compiled.visibility

    @property
    def parents(self) -> Tensor:
        return self.tree.parents

    @property
    def hops(self) -> Tensor:
        """int64 [B, N, max_depth + 1]: [b, i, h] = node i's ancestor h levels up (the root past the top).
        Visibility is this table scattered (for real nodes; padding nodes hop to the root but see only
        themselves); a recurrent state's conv window is a gather along it."""
        if self._hops is None:
            self._hops = ancestor_hops(self.tree.parents, self.max_depth)
        return self._hops

    @classmethod
    def of_rows(cls, trees: list[Tree], compiled: list[CompiledTree], starts: list[int],
                max_depths: list[int], nodes: int | None = None) -> "TreeLayout":
        """``nodes``: pad every row to this many nodes (static shapes; at least the largest tree)."""
        if len(trees) == 1 and (nodes is None or nodes == trees[0].n):
            return cls(trees[0], compiled[0], list(starts), [trees[0].n], max_depths[0], trees, compiled)
        tree, comp = pad_trees(trees, compiled, starts, nodes)
        return cls(tree, comp, list(starts), [t.n for t in trees], max(max_depths), trees, compiled)


def pad_trees(trees: list[Tree], compiled: list[CompiledTree], starts: list[int],
              nodes: int | None = None) -> tuple[Tree, CompiledTree]:
    """Per-row trees [1, n_b] -> padded Tree and CompiledTree [bs, N] with inert padding nodes
    (N = ``nodes``, default the largest tree). Reads nothing from the device."""
    bs, N = len(trees), max(t.n for t in trees)
    if nodes is not None:
        if nodes < N:
            raise ValueError(f"pad_trees(nodes={nodes}) is below the largest tree's {N} nodes")
        N = nodes
    dev = trees[0].tokens.device
    tok = torch.full((bs, N), -1, dtype=torch.long, device=dev)  # -1 equals no target choice
    par = torch.full((bs, N), -1, dtype=torch.long, device=dev)
    dep = torch.zeros(bs, N, dtype=torch.long, device=dev)
    rank = torch.zeros(bs, N, dtype=torch.long, device=dev)
    score = torch.zeros(bs, N, dtype=torch.float64, device=dev)  # path sums are float64 (tree_build)
    pos = torch.zeros(bs, N, dtype=torch.long, device=dev)  # padding sits at its row's root position
    vis = torch.eye(N, dtype=torch.bool, device=dev).repeat(bs, 1, 1)  # padding sees only itself
    nxt = torch.full((bs, N), -1, dtype=torch.long, device=dev)
    sib = torch.full((bs, N), -1, dtype=torch.long, device=dev)
    for b, (t, c) in enumerate(zip(trees, compiled)):
        n = t.n
        tok[b, :n], par[b, :n], dep[b, :n], rank[b, :n], score[b, :n] = (
            t.tokens[0], t.parents[0], t.depth[0], t.rank[0], t.score[0])
        pos[b, :n], vis[b, :n, :n] = c.positions[0], c.visibility[0]
        if n < N:
            pos[b, n:] = c.positions[0, 0]  # a device copy, not the host's start (no host-to-device wait)
        nxt[b, :n], sib[b, :n] = c.retrieve_next_token[0], c.retrieve_next_sibling[0]
    ridx = torch.arange(N, device=dev)[None] + torch.arange(bs, device=dev)[:, None] * N
    return Tree(tok, par, dep, rank, score), CompiledTree(pos, vis, ridx, nxt, sib)
