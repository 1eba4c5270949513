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
    length = ok.sum(-1) - 1
    slot = torch.where(ok, depth, max_depth + 1)  # rejected nodes go to a spare column, dropped below
    index = torch.full((bs, max_depth + 2), -1, dtype=torch.long, device=tokens.device)
    index.scatter_(1, slot, torch.arange(n, device=tokens.device).expand(bs, n))
    index = index[:, : max_depth + 1]
    last = index.gather(1, length[:, None])
    bonus = choice.gather(1, last)[:, 0]
    return Accepted(index, length, bonus)
