"""A transformers GatedDeltaNet layer (Qwen3-Next or Qwen3.5) run over a draft tree through ddtree_kernels.

The layer's own projections, gates, gated RMSNorm and output projection, with its conv and delta rule
replaced by the tree kernels (``dispatch.gdn_tree_conv`` / ``gdn_tree_delta_rule_gated``: with a SGLang
backend, the conv and fused-gating kernels SGLang's Triton GDN backend runs in TARGET_VERIFY), so that every node
continues from its parent. What a hybrid model state calls per linear-attention layer in TARGET_VERIFY;
``tests/models/test_gdn_layer.py`` checks it against the layer's own cached forward of every root-to-node path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels.dispatch import gdn_tree_conv, gdn_tree_delta_rule_gated


@dataclass(frozen=True)
class GDNTreeOut:
    out: Tensor  # [bs, n, hidden]: the layer's output per node
    conv_windows: Tensor  # [bs, n, conv_dim, K-1]: node i's conv window (the request's, once i is accepted last)
    states: Tensor  # [bs, n, HV, Dk, Dv] float32: node i's recurrent state (likewise)


def _projections(layer, hidden: Tensor):
    """-> mixed q|k|v [bs, n, conv_dim], z [bs, n, HV, Dv], b, a [bs, n, HV], for either layer layout."""
    bs, n, _ = hidden.shape
    if hasattr(layer, "in_proj_qkvz"):  # Qwen3-Next: q, k, v, z interleaved per key-head group
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(hidden), layer.in_proj_ba(hidden))
        mixed = torch.cat([t.reshape(bs, n, -1) for t in (q, k, v)], dim=-1)
        return mixed, z, b, a
    z = layer.in_proj_z(hidden).reshape(bs, n, -1, layer.head_v_dim)  # Qwen3.5
    return layer.in_proj_qkv(hidden), z, layer.in_proj_b(hidden), layer.in_proj_a(hidden)


def gdn_layer_tree_forward(layer, hidden: Tensor, conv_window: Tensor, state: Tensor, parents: Tensor,
                           next_token: Tensor, next_sibling: Tensor, backend: str = "torch") -> GDNTreeOut:
    """hidden: [bs, n, hidden] the layer's input per node (flattened tree order); conv_window: [bs, conv_dim, K-1]
    (transformers' cache holds K columns: pass ``conv_states[..., 1:]``); state: [bs, HV, Dk, Dv] (transformers'
    ``recurrent_states``); parents / next_token / next_sibling: int64 [bs, n] (``Tree.parents``,
    ``CompiledTree.retrieve_next_*``)."""
    bs, n, _ = hidden.shape
    mixed, z, b, a = _projections(layer, hidden)
    mixed, windows = gdn_tree_conv(backend, mixed, conv_window, layer.conv1d.weight.squeeze(1), layer.conv1d.bias,
                                   layer.activation, parents, next_token, next_sibling)
    q, k, v = torch.split(mixed, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    q = q.reshape(bs, n, -1, layer.head_k_dim)
    k = k.reshape(bs, n, -1, layer.head_k_dim)
    v = v.reshape(bs, n, -1, layer.head_v_dim)
    core, states = gdn_tree_delta_rule_gated(backend, q, k, v, layer.A_log, layer.dt_bias, a, b, state, parents)
    core = layer.norm(core.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim))
    return GDNTreeOut(layer.out_proj(core.reshape(bs, n, -1)), windows, states)
