"""validate_tree: the contract a tree must meet before the target verifies it (custom policies)."""
from __future__ import annotations

import torch
from torch import Tensor

from ddtree_kernels.tree_build import Tree

INT_FIELDS = ("tokens", "parents", "depth", "rank")


class InvalidTree(ValueError):
    """A tree that the verify and accept stages cannot use; the message names the first violation."""


def _first(bad: Tensor) -> tuple[int, int] | None:
    """First (batch, node) where ``bad`` [bs, n] is true, or None."""
    hits = bad.nonzero()
    return None if hits.shape[0] == 0 else (int(hits[0, 0]), int(hits[0, 1]))


def validate_tree(tree, budget: int, vocab_size: int, root_tokens: Tensor | None = None,
                  max_depth: int | None = None, who: str = "tree") -> None:
    """Raise InvalidTree (one line) unless ``tree`` is a well-formed flattened draft tree.

    Checked in order: a Tree of [bs, n] int64 fields and a float score; the root at index 0
    (parent -1, depth 0, the given root token); at most ``budget`` drafted nodes; every
    parent precedes its child (so every node's whole prefix is in the tree); depth = parent's
    depth + 1 and at most ``max_depth``; tokens in [0, vocab_size); siblings with distinct tokens.
    """
    if not isinstance(tree, Tree):
        raise InvalidTree(f"{who}: the build function returned {type(tree).__name__}, not a ddtree_kernels.Tree")
    shape = tree.tokens.shape
    for name in INT_FIELDS + ("score",):
        t = getattr(tree, name)
        if not isinstance(t, Tensor):
            raise InvalidTree(f"{who}: Tree.{name} is {type(t).__name__}, not a tensor")
        if t.dim() != 2 or t.shape != shape:
            raise InvalidTree(f"{who}: Tree.{name} has shape {list(t.shape)}; every field must be [bs, n] like "
                              f"tokens {list(shape)}")
        if name in INT_FIELDS and t.dtype != torch.long:
            raise InvalidTree(f"{who}: Tree.{name} is {t.dtype}; it must be torch.int64")
        if name == "score" and not t.dtype.is_floating_point:
            raise InvalidTree(f"{who}: Tree.score is {t.dtype}; it must be a float tensor")
    bs, n = shape
    if n < 1:
        raise InvalidTree(f"{who}: the tree has no nodes; index 0 must be the root")
    if root_tokens is not None and bs != root_tokens.numel():
        raise InvalidTree(f"{who}: the tree has batch {bs} but there are {root_tokens.numel()} requests")
    if n - 1 > budget:
        raise InvalidTree(f"{who}: {n - 1} drafted nodes exceed the budget of {budget}")
    par, dep, tok = tree.parents, tree.depth, tree.tokens
    if (hit := _first((par[:, :1] != -1) | (dep[:, :1] != 0))) is not None:
        b = hit[0]
        raise InvalidTree(f"{who}: the root (node 0, batch {b}) must have parent -1 and depth 0, "
                          f"got parent {int(par[b, 0])} and depth {int(dep[b, 0])}")
    if root_tokens is not None and (hit := _first(tok[:, :1] != root_tokens.reshape(bs, 1).to(tok.device))) is not None:
        b = hit[0]
        raise InvalidTree(f"{who}: node 0 (batch {b}) has token {int(tok[b, 0])}, but the root must be the "
                          f"bonus token {int(root_tokens.reshape(-1)[b])}")
    idx = torch.arange(n, device=par.device)
    if (hit := _first((par < 0) & (idx > 0) | (par >= idx))) is not None:
        b, i = hit
        raise InvalidTree(f"{who}: node {i} (batch {b}) has parent {int(par[b, i])}; a parent must precede its "
                          f"child (0 <= parent < {i}), so that every prefix of a node is in the tree")
    want = dep.gather(1, par.clamp(min=0)) + 1
    if (hit := _first((dep != want) & (idx > 0))) is not None:
        b, i = hit
        raise InvalidTree(f"{who}: node {i} (batch {b}) has depth {int(dep[b, i])} but its parent "
                          f"{int(par[b, i])} has depth {int(dep[b, par[b, i]])}; depth must be the parent's + 1")
    if max_depth is not None and (hit := _first(dep > max_depth)) is not None:
        b, i = hit
        raise InvalidTree(f"{who}: node {i} (batch {b}) is at depth {int(dep[b, i])}, deeper than the "
                          f"{max_depth} drafted slots")
    if (hit := _first((tok < 0) | (tok >= vocab_size))) is not None:
        b, i = hit
        raise InvalidTree(f"{who}: node {i} (batch {b}) has token {int(tok[b, i])}, outside the vocabulary "
                          f"[0, {vocab_size})")
    # Siblings: equal (parent, token) pairs among drafted nodes. Key them, sort, compare neighbours.
    key = (par[:, 1:] + 1) * vocab_size + tok[:, 1:]  # [bs, n-1]
    if n > 2:
        srt, order = torch.sort(key, dim=1, stable=True)
        dup = torch.zeros_like(key, dtype=torch.bool)
        dup.scatter_(1, order[:, 1:], srt[:, 1:] == srt[:, :-1])
        if (hit := _first(dup)) is not None:
            b, i = hit[0], hit[1] + 1
            raise InvalidTree(f"{who}: node {i} (batch {b}) repeats token {int(tok[b, i])} of a sibling under "
                              f"parent {int(par[b, i])}; siblings must carry distinct tokens")
