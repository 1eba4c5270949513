"""Tree verify of a GatedDeltaNet layer, batched: the fast torch path beside the per-node oracle.

Same functions, signatures and results as ``ddtree_kernels.gdn_tree`` (the readable reference, one Python step
per node), with the node loop taken out:

- ``tree_causal_conv1d_levels``: a conv reads only *inputs* along a node's path, never another node's output,
  so there is no loop at all: each node's K-1 ancestors come from the ancestor hop table in one gather
  (``tree_compile.ancestor_hops``), topped up from the committed window where the path is shorter than K-1.
- ``tree_gated_delta_rule_levels``: a node's state needs its parent's, so nodes are taken a depth at a
  time, every request's nodes of that depth in one batched update (parents' states gathered by index): the
  Python loop runs depth + 1 times, not n times. Outputs read the states afterwards, all nodes at once.

``ddtree_kernels.dispatch``'s "torch" backend runs these; "torch-oracle" runs the per-node reference, and
``tests/kernels/test_gdn_kernels.py`` holds the two equal on random trees.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree_kernels.gdn_tree import check_conv_inputs, delta_rule_inputs
from ddtree_kernels.tree_compile import ancestor_hops


def tree_levels(parents: Tensor) -> list[Tensor]:
    """parents int64 [bs, n] (-1 at the root, parents before children) -> per depth d = 0, 1, ..., the flat
    indices b * n + i of every request's nodes at depth d (ascending; level 0 is the roots, b * n).

    Depth by pointer jumping (ceil(log2 n) gathers, not a walk per node); one host read for the level sizes.
    """
    bs, n = parents.shape
    anc = parents.clamp(min=0)  # [bs, n]: the root points at itself, so jumps past it stay there
    depth = (parents >= 0).long()  # distance to anc
    for _ in range(max(n - 1, 0).bit_length()):
        depth = depth + depth.gather(1, anc)
        anc = anc.gather(1, anc)
    flat = depth.reshape(-1)
    order = torch.sort(flat, stable=True).indices  # [bs * n]: by depth, then by flat index
    sizes = torch.bincount(flat).tolist()
    return list(order.split(sizes))


def tree_causal_conv1d_levels(x: Tensor, conv_window: Tensor, weight: Tensor, bias: Tensor | None,
                              activation: str | None, parents: Tensor) -> tuple[Tensor, Tensor]:
    """``gdn_tree.tree_causal_conv1d`` in one shot: x [bs, n, dim], conv_window [bs, dim, K-1], weight [dim, K],
    bias [dim] | None, parents int64 [bs, n] -> out [bs, n, dim] (x's dtype), windows [bs, n, dim, K-1] float32."""
    bs, n, dim = x.shape
    K = weight.shape[-1]
    check_conv_inputs(x, conv_window, weight, activation, parents, "tree_causal_conv1d_levels")
    hops = ancestor_hops(parents, K - 1)  # [bs, n, K]: [.., m] = the node m levels up (the root past the top)
    xs = x.float().gather(1, hops.reshape(bs, n * K, 1).expand(bs, n * K, dim)).reshape(bs, n, K, dim)
    if K > 1:
        # m levels up is on the tree path iff m == 0 or the node m - 1 up is not the root (m <= depth); further
        # back the path continues into the committed window: its column K-1 + depth - m (oldest first).
        on_path = torch.cat([torch.ones_like(hops[..., :1], dtype=torch.bool), hops[..., :-1] != 0], -1)  # [bs, n, K]
        depth = on_path[..., 1:].sum(-1, keepdim=True)  # [bs, n, 1]: min(depth, K-1), all the column needs
        col = (K - 1 + depth - torch.arange(K, device=x.device)).clamp(0, K - 2)  # [bs, n, K]
        committed = conv_window.float().transpose(1, 2)  # [bs, K-1, dim]
        cw = committed.gather(1, col.reshape(bs, n * K, 1).expand(bs, n * K, dim)).reshape(bs, n, K, dim)
        xs = torch.where(on_path[..., None], xs, cw)
    full = xs.flip(2).permute(0, 1, 3, 2)  # [bs, n, dim, K]: oldest ... the node itself
    y = (full * weight.float()).sum(-1) + (bias.float() if bias is not None else 0.0)
    out = F.silu(y) if activation is not None else y
    return out.to(x.dtype), full[..., 1:].contiguous()


def tree_gated_delta_rule_levels(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                                 parents: Tensor, scale: float | None = None, use_qk_l2norm: bool = True
                                 ) -> tuple[Tensor, Tensor]:
    """``gdn_tree.tree_gated_delta_rule``, a depth at a time: q, k [bs, n, H, Dk], v [bs, n, HV, Dv], g, beta
    [bs, n, HV], state [bs, HV, Dk, Dv], parents int64 [bs, n] -> out [bs, n, HV, Dv] (q's dtype),
    states [bs, n, HV, Dk, Dv] float32."""
    bs, n, H, Dk = q.shape
    HV, Dv = v.shape[2], v.shape[3]
    dtype = q.dtype
    q, k, v, g, beta = delta_rule_inputs(q, k, v, g, beta, state, parents, scale, use_qk_l2norm,
                                         "tree_gated_delta_rule_levels")
    levels = tree_levels(parents)
    order = torch.cat(levels)  # [bs * n] flat rows b * n + i, a depth at a time: each level is a slice
    k = k.reshape(bs * n, HV, Dk).index_select(0, order)
    v = v.reshape(bs * n, HV, Dv).index_select(0, order)
    decay, beta = (t.reshape(bs * n, HV).index_select(0, order) for t in (g.exp(), beta))
    parent_row = (parents.clamp(min=0) + torch.arange(bs, device=q.device)[:, None] * n).reshape(-1)[order]
    states = torch.empty(bs * n, HV, Dk, Dv, dtype=torch.float32, device=q.device)  # flat rows
    start = 0
    for d, rows in enumerate(levels):  # rows: [m] this depth's nodes, all requests
        at = slice(start, start + len(rows))
        start = at.stop
        h = state.float() if d == 0 else states.index_select(0, parent_row[at])  # [m, HV, Dk, Dv]
        h = h * decay[at, :, None, None]
        k_i = k[at]  # [m, HV, Dk]
        delta = (v[at] - (h * k_i[..., None]).sum(-2)) * beta[at, :, None]  # [m, HV, Dv]: what k_i should read
        states.index_copy_(0, rows, h + k_i[..., None] * delta[..., None, :])
    states = states.reshape(bs, n, HV, Dk, Dv)
    out = (states * q[..., None]).sum(-2)  # [bs, n, HV, Dv]: every node reads its own state
    return out.to(dtype), states
