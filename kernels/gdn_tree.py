"""Tree verify of a GatedDeltaNet (linear-attention) layer: the plain torch oracle.

A recurrent layer takes no attention mask: its conv window and its state run over tokens in order.
In a tree, every node must continue from its *parent*, not from the node before it in the flattened
order. Both pieces of a GatedDeltaNet layer follow that rule here, node by node (parents precede
children in our flattened trees, so one pass in index order sees every parent first), batched over
requests:

- ``tree_causal_conv1d``: the depthwise causal conv of width K over each node's ancestor chain (itself,
  parent, grandparent, ..., then the request's committed window), keeping each node's window of the
  last K-1 inputs along its path (the request's conv window if that node is the last one accepted).
- ``tree_gated_delta_rule``: the gated delta rule where each node starts from its parent's recurrent
  state (the root from the request's committed state), keeping each node's state.

The math is transformers 5.15's ``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet``
(``causal_conv1d_update``, ``l2norm``, ``torch_recurrent_gated_delta_rule``, the gates in ``gdn_gates``),
in float32; on a chain (one path) the outputs equal transformers' own conv and recurrent functions
(``tests/kernels/test_gdn_kernels.py``). SGLang's Triton kernels for the same job are in
``ddtree_kernels.sglang_gdn``; the same functions batched a tree depth at a time (what the "torch" backend
runs) are in ``ddtree_kernels.gdn_tree_fast``; ``ddtree_kernels.dispatch`` chooses ("torch-oracle" = this file).

Layouts (transformers' own): recurrent state ``[bs, HV, Dk, Dv]``; conv window ``[bs, dim, K-1]``, oldest
column first. SGLang keeps its state as ``[HV, Dv, Dk]``; ``sglang_gdn`` converts.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def parents_from_links(next_token: Tensor, next_sibling: Tensor) -> Tensor:
    """``retrieve_parent_token`` derived from the EAGLE links, the way SGLang's conv kernel derives it.

    Walking the nodes in index order: node i's first child has parent i, and i's next sibling has i's
    parent. That needs every node's first child or previous sibling to come before it, which holds for
    our trees (parents precede children, siblings in index order). next_token / next_sibling: int64
    [bs, n] (-1 = none) -> parents int64 [bs, n], -1 at the root (SGLang's kernel leaves 0 there; no
    kernel reads the root's entry).
    """
    bs, n = next_token.shape
    parents = torch.full((bs, n), -1, dtype=torch.long, device=next_token.device)
    rows = torch.arange(bs, device=next_token.device)
    for i in range(n):
        child, sib = next_token[:, i], next_sibling[:, i]
        has_child, has_sib = child >= 0, sib >= 0
        parents[rows[has_child], child[has_child]] = i
        parents[rows[has_sib], sib[has_sib]] = parents[rows[has_sib], i]
    return parents


def _check_tree(parents: Tensor, n: int, what: str) -> None:
    if parents.shape[1] != n:
        raise ValueError(f"{what}: parents has {parents.shape[1]} nodes per request but the inputs have {n}")
    idx = torch.arange(n, device=parents.device)
    if n and (bool((parents[:, 0] != -1).any()) or bool((parents[:, 1:] >= idx[1:]).any())
              or bool((parents[:, 1:] < 0).any())):
        raise ValueError(f"{what}: parents must be -1 at the root (node 0) and precede every other node, "
                         f"got {parents.tolist()[:4]}")


def check_conv_inputs(x: Tensor, conv_window: Tensor, weight: Tensor, activation: str | None, parents: Tensor,
                      what: str) -> None:
    """One-line ValueErrors for a tree conv's inputs (shared by the oracle and the level-batched path)."""
    bs, n, dim = x.shape
    K = weight.shape[-1]
    if weight.shape != (dim, K) or conv_window.shape != (bs, dim, K - 1):
        raise ValueError(f"{what}: want x [bs, n, dim], weight [dim, K], conv_window [bs, dim, K-1]; "
                         f"got x {list(x.shape)}, weight {list(weight.shape)}, conv_window {list(conv_window.shape)}")
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"{what}: activation={activation!r}; want 'silu' or None")
    _check_tree(parents, n, what)


def tree_causal_conv1d(x: Tensor, conv_window: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None,
                       parents: Tensor) -> tuple[Tensor, Tensor]:
    """The short causal conv of a GatedDeltaNet layer over each node's ancestor chain.

    x: [bs, n, dim] the layer's projected q|k|v per node; conv_window: [bs, dim, K-1] the request's
    committed last K-1 inputs, oldest first (transformers' cache keeps K columns: pass
    ``conv_states[..., 1:]``, the first is never read by a width-K conv); weight: [dim, K]
    (``conv1d.weight.squeeze(1)``); bias: [dim] or None; activation: "silu" or None; parents: int64 [bs, n].
    -> out [bs, n, dim] (x's dtype), windows [bs, n, dim, K-1] float32: node i's window, i.e. the last
    K-1 inputs along its path, the request's conv window once i is the last accepted node.
    """
    bs, n, dim = x.shape
    K = weight.shape[-1]
    check_conv_inputs(x, conv_window, weight, activation, parents, "tree_causal_conv1d")
    rows = torch.arange(bs, device=x.device)
    w = weight.float()
    windows = torch.empty(bs, n, dim, K - 1, dtype=torch.float32, device=x.device)
    out = torch.empty(bs, n, dim, dtype=torch.float32, device=x.device)
    for i in range(n):
        p = parents[:, i]  # [bs]
        # The window this node continues: its parent's, the committed one at the root.
        before = torch.where((p < 0)[:, None, None], conv_window.float(), windows[rows, p.clamp(min=0)])
        full = torch.cat([before, x[:, i, :, None].float()], dim=-1)  # [bs, dim, K]: oldest ... itself
        y = (full * w).sum(-1) + (bias.float() if bias is not None else 0.0)
        out[:, i] = F.silu(y) if activation is not None else y
        windows[:, i] = full[..., 1:]
    return out.to(x.dtype), windows


def l2norm(x: Tensor, dim: int = -1, eps: float = 1e-6) -> Tensor:
    """transformers' (and FLA's) l2norm: x / sqrt(sum x^2 + eps)."""
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def gdn_gates(A_log: Tensor, dt_bias: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """The layer's gates, as transformers computes them: a, b [..., HV] -> g (log decay), beta, float32."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.float().sigmoid()


def delta_rule_inputs(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, parents: Tensor,
                      scale: float | None, use_qk_l2norm: bool, what: str) -> tuple[Tensor, ...]:
    """Checks a tree delta rule's inputs (one-line ValueErrors) and prepares them as both tree paths read them:
    -> q (l2-normalised, scaled), k (l2-normalised) [bs, n, HV, Dk] (key heads repeated per value head),
    v [bs, n, HV, Dv], g, beta [bs, n, HV], all float32."""
    bs, n, H, Dk = q.shape
    HV, Dv = v.shape[2], v.shape[3]
    if k.shape != q.shape or v.shape[:2] != (bs, n) or HV % H or g.shape != (bs, n, HV) or beta.shape != g.shape \
            or state.shape != (bs, HV, Dk, Dv):
        raise ValueError(
            f"{what}: want q, k [bs, n, H, Dk], v [bs, n, HV, Dv] (HV % H == 0), g, beta [bs, n, HV], "
            f"state [bs, HV, Dk, Dv]; got q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}, g {list(g.shape)}, "
            f"beta {list(beta.shape)}, state {list(state.shape)}")
    _check_tree(parents, n, what)
    if use_qk_l2norm:
        q, k = l2norm(q.float()), l2norm(k.float())
    q, k = q.float().repeat_interleave(HV // H, dim=2), k.float().repeat_interleave(HV // H, dim=2)
    q = q * (Dk ** -0.5 if scale is None else scale)
    return q, k, v.float(), g.float(), beta.float()


def tree_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, parents: Tensor,
                          scale: float | None = None, use_qk_l2norm: bool = True) -> tuple[Tensor, Tensor]:
    """The gated delta rule where each node starts from its parent's state (the root from ``state``).

    q, k: [bs, n, H, Dk]; v: [bs, n, HV, Dv] (HV a multiple of H: value head h reads key head
    h // (HV // H), as transformers' repeat_interleave); g, beta: [bs, n, HV] (``gdn_gates``);
    state: [bs, HV, Dk, Dv] the request's committed state; parents: int64 [bs, n]; scale: Dk ** -0.5 by default.
    -> out [bs, n, HV, Dv] (q's dtype), states [bs, n, HV, Dk, Dv] float32: node i's state after
    consuming it, the request's state once i is the last accepted node.
    """
    bs, n, H, Dk = q.shape
    HV, Dv = v.shape[2], v.shape[3]
    dtype = q.dtype
    q, k, v, g, beta = delta_rule_inputs(q, k, v, g, beta, state, parents, scale, use_qk_l2norm,
                                         "tree_gated_delta_rule")
    rows = torch.arange(bs, device=q.device)
    states = torch.empty(bs, n, HV, Dk, Dv, dtype=torch.float32, device=q.device)
    out = torch.empty(bs, n, HV, Dv, dtype=torch.float32, device=q.device)
    for i in range(n):
        p = parents[:, i]
        h = torch.where((p < 0)[:, None, None, None], state.float(), states[rows, p.clamp(min=0)])  # [bs, HV, Dk, Dv]
        h = h * g[:, i, :, None, None].exp()  # decay
        k_i = k[:, i]  # [bs, HV, Dk]
        delta = (v[:, i] - (h * k_i[..., None]).sum(-2)) * beta[:, i, :, None]  # [bs, HV, Dv]: what k_i should read
        h = h + k_i[..., None] * delta[..., None, :]
        states[:, i] = h
        out[:, i] = (h * q[:, i, :, :, None]).sum(-2)
    return out.to(dtype), states


def commit_nodes(windows: Tensor, states: Tensor, last: Tensor) -> tuple[Tensor, Tensor]:
    """After accept: the request's conv window and recurrent state become those of its last accepted node
    (SGLang's ``update_mamba_state_after_mtp_verify`` scatter; nothing recomputed, nothing cropped).
    windows [bs, n, dim, K-1], states [bs, n, HV, Dk, Dv], last int64 [bs] (0 = only the root accepted)
    -> conv_window [bs, dim, K-1], state [bs, HV, Dk, Dv]."""
    rows = torch.arange(windows.shape[0], device=windows.device)
    return windows[rows, last], states[rows, last]
