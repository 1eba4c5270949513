"""Commit: keep the accepted rows of the target cache, extend the output, stop on end-of-text."""
from __future__ import annotations

from dataclasses import dataclass

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
    L = int(accepted.length[0])  # one host read per cycle: the accepted length decides shapes below
    nodes = accepted.index[0, : L + 1]
    cache.keep_rows(start, nodes)
    toks = tree.tokens[0, nodes].tolist()
    bonus = int(accepted.bonus[0])
    ctx = features[:, nodes] if features is not None else None
    # The root was the previous bonus, already shown; new tokens are the accepted drafts and the bonus.
    return Committed(nodes, toks[1:] + [bonus], bonus, ctx)
