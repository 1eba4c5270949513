"""What a hook may put in place of a stage's output (``workbench.engine.hooks``), checked before the cycle uses it.

A replacement is an investigation ("what if the tree were this?", "what if the target had chosen that?",
"what if this path were accepted?"), so each one is held to what the later stages need, not to what the
target would have done: a tree must be a valid tree for the row (its root, its depth bound, its node
bound under static shapes), choices must be token ids at every node, a path must be a root-to-node path
of the tree. A replaced choice or path may make the output differ from the target's own; the cycle
records every replacement (``Cycle.replaced``) so that is never silent. Every error is one line.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ddtree_kernels import Accepted, InvalidTree, Tree, validate_tree
from workbench.engine.stages.tree_check import at_row
from workbench.engine.stages.verify import Verified


def checked_tree(value, root: int, vocab: int, max_depth: int, nodes: int | None, like: Tree, row: int = 0) -> Tree:
    """``value`` as the tree row ``row`` (rooted at ``root``) verifies this cycle: a ``ddtree_kernels.Tree`` of
    [1, n] fields at most ``max_depth`` deep (the slots this row may verify: its block, its tokens left, the
    model's positions) and, under static shapes, at most ``nodes`` nodes; on ``like``'s device."""
    who = f"the tree a cycle.hook_tree hook returned for row {row}"
    if not isinstance(value, Tree):
        raise ValueError(f"{who} is {type(value).__name__}, not a ddtree_kernels.Tree")
    dev = like.tokens.device
    for name in ("tokens", "parents", "depth", "rank", "score"):
        t = getattr(value, name)
        if isinstance(t, Tensor) and t.device != dev:
            raise ValueError(f"{who} has {name} on {t.device}; the cycle runs on {dev}: move it with .to({str(dev)!r})")
    if isinstance(value.tokens, Tensor) and (value.tokens.dim() != 2 or value.tokens.shape[0] != 1):
        raise ValueError(f"{who} has tokens of shape {list(value.tokens.shape)}; one row's tree is [1, n]")
    n = value.tokens.shape[1]
    budget = n - 1 if nodes is None else nodes - 1  # only static shapes bound the nodes (the verify's padding)
    try:
        validate_tree(value, budget, vocab, torch.tensor([root], device=dev), max_depth, who=who)
    except InvalidTree as e:
        raise at_row(e, None) from None  # ``who`` names the row
    # The batch's trees are padded into one [B, N] layout: keep the score's dtype so rows stack alike.
    return Tree(value.tokens, value.parents, value.depth, value.rank, value.score.to(like.score.dtype))


def checked_choices(value, n: int, vocab: int, like: Tensor) -> Tensor:
    """``value`` as the target's choice at each of a row's ``n`` nodes: integer token ids, [1, n] or [n]."""
    who = "the choices a cycle.hook_choices hook returned"
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value)
    if value.dtype.is_floating_point or value.dtype == torch.bool or value.dtype.is_complex:
        raise ValueError(f"{who} are {value.dtype}; give token ids (an integer tensor)")
    if value.dim() == 1:
        value = value[None]
    if list(value.shape) != [1, n]:
        raise ValueError(f"{who} have shape {list(value.shape)}; the tree has {n} nodes, so give [1, {n}]")
    value = value.to(device=like.device, dtype=torch.long)
    bad = ((value < 0) | (value >= vocab)).nonzero()
    if bad.shape[0]:
        i = int(bad[0, 1])
        raise ValueError(f"{who} put token {int(value[0, i])} at node {i}, outside the vocabulary [0, {vocab})")
    return value


def checked_path(value, parents: Sequence[int], like: Tensor) -> Tensor:
    """``value`` as an accepted path of the tree whose node parents are ``parents``: node indices, root (0)
    first, each the child of the one before. -> int64 [L + 1] on ``like``'s device."""
    who = "the path a cycle.hook_accepted hook returned"
    if isinstance(value, Tensor):
        if value.dtype.is_floating_point or value.dtype == torch.bool or value.dim() != 1:
            raise ValueError(f"{who} is a {value.dtype} tensor of shape {list(value.shape)}; give node indices, "
                             "int64 [L + 1], root first")
        path = value.tolist()
    elif isinstance(value, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        path = list(value)
    else:
        raise ValueError(f"{who} is {type(value).__name__}; give node indices (a list or an int64 tensor), root first")
    n = len(parents)
    if not path or path[0] != 0:
        raise ValueError(f"{who} is {path[:8]}; a path starts at the root, node 0")
    for a, b in zip(path, path[1:]):
        if not 0 <= b < n or parents[b] != a:
            raise ValueError(f"{who} steps from node {a} to node {b}, which is not its child in the tree "
                             f"({n} nodes)")
    return torch.tensor(path, dtype=torch.long, device=like.device)


def with_choices(verified: Verified, rows: dict[int, Tensor]) -> Verified:
    """``verified`` with row b's choices [1, n_b] put in for each b of ``rows`` (a copy: the forward's own
    outputs are left as they were). The probabilities and top-2 stay the target's own."""
    choice = verified.choice.clone()  # [B, N]
    for b, c in rows.items():
        choice[b, : c.shape[1]] = c[0]
    return Verified(choice, verified.choice_prob, verified.features, verified.record,
                    verified.top2_tokens, verified.top2_logits)


def with_paths(accepted: Accepted, paths: dict[int, Tensor], choice: Tensor) -> Accepted:
    """``accepted`` with row b's path [L + 1] put in for each b of ``paths``; its bonus becomes the target's
    choice (``choice`` [B, N], replaced or not) at the path's last node, as the accept walk's would."""
    index, length, bonus = accepted.index.clone(), accepted.length.clone(), accepted.bonus.clone()
    for b, p in paths.items():
        index[b] = -1
        index[b, : p.shape[0]] = p  # [max_depth + 1]: a path of the tree is at most that long
        length[b] = p.shape[0] - 1
        bonus[b] = choice[b, p[-1]]
    return Accepted(index, length, bonus)
