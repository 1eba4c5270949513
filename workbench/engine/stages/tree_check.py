"""Tree check: every tree a policy builds (built-in, calibrated, a plugin's, a TreePolicy's) meets the contract the
compile, verify and accept stages rely on (``ddtree_kernels.validate_tree``'s rules) before the target verifies it.

The rules are checked for a cycle's rows at once: rows with trees of one size and one depth bound are stacked and
checked by a fixed handful of tensor calls, whatever their number of nodes. The answer for host trees (the heap
builds) is read at once; for device trees, and wherever the build must never wait for the device (static shapes,
CUDA graphs), it joins the commit's one host read (``TreeCheck``: no wait of its own) and a bad row is verified as
an inert tree until then (it can index nothing out of range). Either way the cycle stops with one line naming the policy, the first violation and, in a batch, the row, before anything
is committed.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from ddtree_kernels import InvalidTree, Tree, validate_tree

INT_FIELDS = ("tokens", "parents", "depth", "rank")


@dataclass
class TreeCheck:
    """A check whose answer is read with the commit (device trees, static shapes): ``fault`` bool [] on the trees'
    device, true when some row's tree broke a rule; ``explain()`` then names the first violation."""

    fault: Tensor
    trees: list  # each checked row's tree as its policy built it: (row, who, tree, root, vocab, max_depth, budget)
    rows: int  # rows in the cycle (a lone row's message names no row)

    def explain(self) -> InvalidTree:
        return first_violation(self.trees, self.rows)


def form_problem(tree) -> str:
    """What keeps ``tree`` from being a ``Tree`` of [1, n >= 1] int64 fields and a float score on one device, or ''
    (host reads only)."""
    if not isinstance(tree, Tree) or not isinstance(tree.tokens, Tensor):
        return "it is not a ddtree_kernels.Tree of tensors"
    tok = tree.tokens
    if tok.dim() != 2 or tok.shape[0] != 1 or tok.shape[1] < 1:
        return f"Tree.tokens has shape {list(tok.shape)}; one row's tree is [1, n >= 1]"
    for name in INT_FIELDS + ("score",):
        t = getattr(tree, name)
        if not isinstance(t, Tensor) or t.shape != tok.shape:
            return f"Tree.{name} is not a tensor of the tokens' shape {list(tok.shape)}"
        if (t.dtype != torch.long) if name != "score" else not t.dtype.is_floating_point:
            return f"Tree.{name} is {t.dtype}; it must be " + ("a float tensor" if name == "score" else "torch.int64")
    return device_problem(tree)


def device_problem(tree) -> str:
    """A field of ``tree`` on another device than its tokens, or ''."""
    for name in INT_FIELDS[1:] + ("score",):
        t = getattr(tree, name, None)
        if isinstance(t, Tensor) and isinstance(tree.tokens, Tensor) and t.device != tree.tokens.device:
            return (f"Tree.{name} is on {t.device} but Tree.tokens on {tree.tokens.device}; every field must be on "
                    "one device")
    return ""


@lru_cache(maxsize=64)
def node_bounds(n: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """For n nodes: (each node's lowest parent, its highest parent, 1 below the root and 0 at it), each [n]; the
    root's parent is -1 ([-1, -1]), node i's lies in [0, i - 1]. Made once per tree size and device."""
    idx = torch.arange(n, device=device)
    below = (idx > 0).long()
    return below - 1, idx - 1, below


def tree_faults(tok: Tensor, par: Tensor, dep: Tensor, roots: Tensor, vocab: int, max_depth: int) -> Tensor:
    """bool [g]: which of g stacked trees ([g, n] fields, ``roots`` [g]) break a rule: the root first (parent -1,
    depth 0, the bonus token), every parent before its child, depth = the parent's + 1 and at most ``max_depth``,
    tokens in [0, vocab), siblings with distinct tokens. No host read."""
    n = tok.shape[1]
    lo, hi, below = node_bounds(n, tok.device)  # [n] each
    bad = (par < lo) | (par > hi)  # [g, n]
    want = (dep.gather(1, par.clamp(0, n - 1)) + 1) * below  # [g, n]: the parent's depth + 1, 0 at the root
    bad |= (dep != want) | (dep > max_depth) | (tok.clamp(0, vocab - 1) != tok)
    out = bad.any(dim=1) | (tok[:, 0] != roots)  # [g]
    if n > 2:  # siblings: equal (parent, token) keys among drafted nodes are neighbours once sorted
        key = (par[:, 1:].clamp(min=-1) + 1) * vocab + tok[:, 1:].clamp(0, vocab - 1)  # [g, n - 1]
        srt = key.sort(dim=1).values
        out |= (srt[:, 1:] == srt[:, :-1]).any(dim=1)
    return out


def at_row(error: InvalidTree, row: int | None) -> InvalidTree:
    """The tree check's line about a one-row tree (``validate_tree`` numbers its rows from 0) naming the row of
    the cycle that tree was built for, as a hook's ``hook.row`` does (``row`` None: the caller's words name it)."""
    msg = str(error)
    if row is None:
        return InvalidTree(msg.replace(", batch 0)", ")").replace(" (batch 0)", ""))
    if "batch 0)" not in msg:
        return InvalidTree(f"row {row}: {msg}")
    return InvalidTree(msg.replace(", batch 0)", f", row {row})").replace(" (batch 0)", f" (row {row})"))


def first_violation(checked: list, rows: int) -> InvalidTree:
    """The one-line error of the first bad tree among ``checked`` ((row, who, tree, root, vocab, max_depth, budget)
    each), its row named in a batch (``at_row``)."""
    for b, who, tree, root, vocab, max_depth, budget in checked:
        if isinstance(tree, Tree) and device_problem(tree):  # before validate_tree, which reads the fields together
            return InvalidTree((f"row {b}: " if rows > 1 else "") + f"{who}: {device_problem(tree)}")
        try:
            validate_tree(tree, budget, vocab, torch.full((1,), root, dtype=torch.long, device=tree.tokens.device)
                          if isinstance(tree, Tree) and isinstance(tree.tokens, Tensor) else None, max_depth, who=who)
        except InvalidTree as e:
            return at_row(e, b if rows > 1 else None)
    b, who, tree = checked[0][:3]
    why = form_problem(tree) or "it breaks a rule of the tree check"
    return InvalidTree((f"row {b}: " if rows > 1 else "") + f"{who}: {why}")


def check_trees(trees: list[Tree], checked: list, nodes: int | None,
                sync_free: bool) -> tuple[list[Tree], TreeCheck | None]:
    """Check the trees of ``checked`` ((row, who, root, vocab, max_depth) each: the rows a policy built); raise
    InvalidTree (one line) at the first bad one among host trees, or, for device trees and wherever the device must
    not be waited for (``sync_free``), return a ``TreeCheck`` to read with the commit and the trees with any bad row
    made inert.
    ``nodes``: the node bound of every tree (static shapes), else each tree's own size."""
    rows = len(trees)
    full = [(b, who, trees[b], root, vocab, max_depth, (nodes if nodes is not None else size(trees[b])) - 1)
            for b, who, root, vocab, max_depth in checked]
    bad_form = [c for c in full if form_problem(c[2]) or (nodes is not None and c[2].n > nodes)]
    if bad_form:
        raise first_violation(bad_form, rows)
    groups: dict[tuple, list] = {}
    for c in full:  # one stack per tree size, vocabulary, depth bound and device: usually one for the cycle
        groups.setdefault((c[2].n, c[4], c[5], c[2].tokens.device), []).append(c)
    now, later, out = [], [], list(trees)
    for (n, vocab, max_depth, dev), group in groups.items():
        one = [c[2] for c in group]
        tok, par, dep = (torch.cat([getattr(t, f) for t in one]) for f in ("tokens", "parents", "depth"))  # [g, n]
        now_here = not sync_free and dev.type == "cpu"  # a host tree's answer is read for free
        if now_here:
            roots = torch.tensor([c[3] for c in group], dtype=torch.long, device=dev)
        else:  # fills: a host-to-device copy of the roots would wait for the device
            roots = torch.cat([torch.full((1,), c[3], dtype=torch.long, device=dev) for c in group])
        f = tree_faults(tok, par, dep, roots, vocab, max_depth)  # [g]
        if now_here:
            now.append(f.any())
        else:
            later.append(f.any())
            for j, t in enumerate(inert_where(f, tok, par, dep, roots, one)):
                out[group[j][0]] = t
    if any(f.tolist() for f in now):  # one host read per stack
        raise first_violation(full, rows)
    return out, (TreeCheck(torch.stack(later).any(), full, rows) if later else None)


def size(tree) -> int:
    """Nodes of a tree that may not be well formed (1 where its size cannot be read)."""
    t = getattr(tree, "tokens", None)
    return t.shape[-1] if isinstance(t, Tensor) and t.dim() >= 1 else 1


def inert_where(bad: Tensor, tok: Tensor, par: Tensor, dep: Tensor, roots: Tensor, trees: list[Tree]) -> list[Tree]:
    """The trees with each ``bad`` row [g] replaced by an inert one (every node a child of the root carrying the
    root's token): what a bad row verifies until the commit's host read stops the cycle, so no index it feeds the
    compile, the verify and the accept is out of range."""
    n = tok.shape[1]
    lo, _, below = node_bounds(n, tok.device)  # [n]: -1 / 0 at the root, 0 / 1 elsewhere
    keep = ~bad[:, None]  # [g, 1]
    tok = torch.where(keep, tok, roots[:, None].expand(-1, n))
    par = torch.where(keep, par, lo)
    dep = torch.where(keep, dep, below)
    return [Tree(tok[j : j + 1], par[j : j + 1], dep[j : j + 1], t.rank, t.score) for j, t in enumerate(trees)]
