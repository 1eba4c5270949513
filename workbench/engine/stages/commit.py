"""Commit: tell the target's state which nodes each row accepted; read the new tokens once for all rows."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels import Accepted
from workbench.engine.stages.tree_check import TreeCheck
from workbench.models.layout import TreeLayout


@dataclass
class Committed:
    nodes: Tensor  # int64 [L + 1] accepted node indices, root first
    tokens: list[int]  # tokens appended to the output this cycle (root + accepted drafts, then the bonus)
    bonus: int
    context: Tensor | None  # [1, L + 1, F] drafter context of the accepted rows


def commit(state, layout: TreeLayout, accepted: Accepted, features: Tensor | None,
           check: TreeCheck | None = None) -> list[Committed]:
    """``state``: the target's ``TargetState``; it keeps each row's accepted nodes and drops the rest.
    ``check``: the tree check a build that never waits for the device left to this read: a bad tree stops the
    cycle here, before the state keeps anything (InvalidTree, one line)."""
    # The cycle's one host read: every row's accepted length, bonus and path tokens, copied together.
    path_tokens = layout.tree.tokens.gather(1, accepted.index.clamp(min=0))  # [B, max_depth + 1], padded
    cols = [accepted.length[:, None], accepted.bonus[:, None], path_tokens]
    if check is not None:
        cols.append(check.fault.long().expand(path_tokens.shape[0])[:, None])  # [B, 1]: the same flag on each row
    host = torch.cat(cols, dim=1).tolist()
    if check is not None and host[0][-1]:
        raise check.explain()
    nodes = [accepted.index[b, : h[0] + 1] for b, h in enumerate(host)]
    state.commit(layout, nodes)
    out = []
    for b, (h, x) in enumerate(zip(host, nodes)):
        L, bonus = h[0], h[1]
        ctx = features[b : b + 1, x] if features is not None else None
        # The root was the previous bonus, already shown; new tokens are the accepted drafts and the bonus.
        out.append(Committed(x, h[3 : L + 3] + [bonus], bonus, ctx))
    return out
