"""Accept walk: follow the target's choices down the tree.

A node is accepted when its token equals the target's choice at its parent and
its parent is accepted (the root always is). Siblings carry distinct tokens, so
the accepted nodes form one path; the target's choice at its end is the bonus.
Works for greedy (choice = argmax) and sampling (choice = a target sample) alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Accepted:
    index: Tensor  # int64 [bs, max_depth + 1]: accepted node indices by depth, root first, -1 padded
    length: Tensor  # int64 [bs]: accepted drafted tokens (root not counted)
    bonus: Tensor  # int64 [bs]: the target's choice at the last accepted node


def accept_walk(tokens: Tensor, parents: Tensor, depth: Tensor, visibility: Tensor, choice: Tensor,
                max_depth: int) -> Accepted:
    """Vectorized walk: tokens/parents/depth/choice [bs, n], visibility [bs, n, n]."""
    bs, n = tokens.shape
    agreed = tokens == choice.gather(1, parents.clamp(min=0))  # [bs, n]: target agreed with this node
    agreed[:, 0] = True
    # Accepted = agreed and every ancestor agreed.
    ok = ~(visibility & ~agreed[:, None, :]).any(-1)  # [bs, n]
    # A visibility that hides an ancestor leaves a node ok under a rejected parent: the parent's verdict is held
    # too, and below only the run of depths whose node hangs from the one before counts (the accepted path).
    ok &= ok.gather(1, parents.clamp(min=0))
    slot = torch.where(ok, depth, max_depth + 1)  # rejected nodes go to a spare column, dropped below
    index = torch.full((bs, max_depth + 2), -1, dtype=torch.long, device=tokens.device)
    # the smallest node of each depth where a faulty visibility leaves several (one, on a well-formed one)
    index.scatter_reduce_(1, slot, torch.arange(n, device=tokens.device).expand(bs, n), "amin", include_self=False)
    index = index[:, : max_depth + 1]
    linked = parents.gather(1, index.clamp(min=0))[:, 1:] == index[:, :-1]  # [bs, max_depth]
    on_path = torch.cat([index[:, :1] >= 0, linked & (index[:, 1:] >= 0)], 1).long().cumprod(1).bool()
    index = torch.where(on_path, index, -1)
    length = on_path.sum(-1) - 1
    last = index.gather(1, length[:, None])
    bonus = choice.gather(1, last)[:, 0]
    return Accepted(index, length, bonus)
