"""Commit: keep the accepted rows of the target cache, extend the output, stop on end-of-text."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels import Accepted, Tree


@dataclass
class Committed:
    nodes: Tensor  # int64 [L + 1] accepted node indices, root first
    tokens: list[int]  # tokens appended to the output this cycle (root + accepted drafts, then the bonus)
    bonus: int
    context: Tensor | None  # [1, L + 1, F] drafter context of the accepted rows


def commit(cache, tree: Tree, accepted: Accepted, features: Tensor | None, start: int) -> Committed:
    """``cache`` is a ``workbench.kv_cache.BufferedCache``: only the accepted rows are moved."""
    # The cycle's one host read: accepted length, bonus and the path's tokens, copied together.
    path_tokens = tree.tokens[:1].gather(1, accepted.index[:1].clamp(min=0))  # [1, max_depth + 1], padded
    host = torch.cat([accepted.length[:1, None], accepted.bonus[:1, None], path_tokens], dim=1)[0].tolist()
    L, bonus = host[0], host[1]
    toks = host[2 : L + 3]
    nodes = accepted.index[0, : L + 1]
    cache.keep_rows(start, nodes)
    ctx = features[:, nodes] if features is not None else None
    # The root was the previous bonus, already shown; new tokens are the accepted drafts and the bonus.
    return Committed(nodes, toks[1:] + [bonus], bonus, ctx)
