"""SGLang 0.5.23's own tree-verify kernels for GatedDeltaNet layers, called as pure functions.

- ``causal_conv1d_update`` (``sglang.kernels.ops.mamba.causal_conv1d_triton``) in tree mode: each node
  convolves with its ancestors, derives ``retrieve_parent_token`` from ``retrieve_next_token`` /
  ``retrieve_next_sibling`` and writes every node's conv window to ``intermediate_conv_window``
  ``[cache line, step, dim, K-1]``.
- ``fused_recurrent_gated_delta_rule_update_fwd`` (``sglang.kernels.ops.attention.fla.fused_recurrent``) and
  ``fused_sigmoid_gating_delta_rule_update`` (``...attention.linear.fused_sigmoid_gating_recurrent``, the same
  with the gates computed inside: what SGLang's Triton GDN backend runs in TARGET_VERIFY):
  each node starts from its parent's state (``retrieve_parent_token``; the root from
  ``initial_state_source[initial_state_indices]``) and writes its state to ``intermediate_states_buffer``
  ``[cache line, cache_steps, HV, Dv, Dk]``.

Both are Triton kernels: on CPU tensors they run under Triton's interpreter (``sglang_backend.
import_triton_module`` sets it up, as for the verify kernel). Same signatures and layouts as the oracle in
``ddtree_kernels.gdn_tree`` (transformers' ``[HV, Dk, Dv]`` state), so the parity tests compare them
directly; SGLang's own ``[HV, Dv, Dk]`` is converted here. Neither kernel's in-place side effects
(the conv kernel shifts ``conv_state`` by the flattened tokens; the recurrent one can overwrite the
initial state) reach the caller: they act on copies.

Interpreter workarounds, none of them edits to the installed files (only when ``TRITON_INTERPRET=1``):
``fused_recurrent``'s module-level alias ``exp = tl.exp`` is swapped for a ``@triton.jit`` function that
calls ``tl.exp`` (the interpreter patches ``tl.`` attributes while a kernel runs, not aliases taken at
import); ``causal_conv1d_update`` and ``fused_sigmoid_gating_delta_rule_update`` ask
``is_arch_support_pdl()``, which raises without a CUDA device: answered False; the autograd wrapper
``fused_recurrent_gated_delta_rule_update`` (its ``input_guard`` calls ``torch.cpu.device``) is skipped for
the ``_fwd`` function it wraps; and the two interpreter fixes in ``sglang_backend._interpreter_fixes``.
"""
from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor

from ddtree_kernels.sglang_backend import import_triton_module

CONV_MODULE = "sglang.kernels.ops.mamba.causal_conv1d_triton"
RECURRENT_MODULE = "sglang.kernels.ops.attention.fla.fused_recurrent"
GATED_MODULE = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"
CONV_KERNEL = f"{CONV_MODULE}.causal_conv1d_update"
RECURRENT_KERNEL = f"{RECURRENT_MODULE}.fused_recurrent_gated_delta_rule_update_fwd"
GATED_KERNEL = f"{GATED_MODULE}.fused_sigmoid_gating_delta_rule_update"
_modules: dict[str, object] = {}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def load_conv(device):
    """sglang's causal_conv1d_triton module, ready for tensors on ``device``."""
    if CONV_MODULE not in _modules:
        mod = import_triton_module(CONV_MODULE, device)
        if _interpreting():
            mod.is_arch_support_pdl = lambda: False  # PDL is a Hopper launch option; no CUDA device here
        _modules[CONV_MODULE] = mod
    return _modules[CONV_MODULE]


def load_recurrent(device):
    """sglang's fused_recurrent module, ready for tensors on ``device``."""
    if RECURRENT_MODULE not in _modules:
        with warnings.catch_warnings():  # fla.utils warns "Triton is not supported on current platform" on a CPU
            warnings.simplefilter("ignore", UserWarning)
            mod = import_triton_module(RECURRENT_MODULE, device)
        if _interpreting():
            from ddtree_kernels import interp_ops

            mod.exp = interp_ops.exp
        _modules[RECURRENT_MODULE] = mod
    return _modules[RECURRENT_MODULE]


def load_gated(device):
    """sglang's fused_sigmoid_gating_recurrent module (the kernel its Triton GDN backend runs in TARGET_VERIFY)."""
    if GATED_MODULE not in _modules:
        mod = import_triton_module(GATED_MODULE, device)
        if _interpreting():
            mod.is_arch_support_pdl = lambda: False
        _modules[GATED_MODULE] = mod
    return _modules[GATED_MODULE]


def tree_causal_conv1d(x: Tensor, conv_window: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None,
                       next_token: Tensor, next_sibling: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """SGLang's tree conv. x: [bs, n, dim]; conv_window: [bs, dim, K-1]; weight: [dim, K]; bias: [dim] or None;
    next_token / next_sibling: int64 [bs, n] (``CompiledTree.retrieve_next_*``).
    -> out [bs, n, dim], windows [bs, n, dim, K-1] (conv_window's dtype), retrieve_parent_token int64 [bs, n]
    as the kernel derived it (0 at the root)."""
    bs, n, dim = x.shape
    K = weight.shape[-1]
    if conv_window.shape != (bs, dim, K - 1):
        raise ValueError(f"tree_causal_conv1d: conv_window is {list(conv_window.shape)}, want [bs, dim, K-1] = "
                         f"{[bs, dim, K - 1]}")
    mod = load_conv(x.device)
    slots = torch.arange(bs, dtype=torch.int32, device=x.device)
    windows = torch.empty(bs, n, dim, K - 1, dtype=conv_window.dtype, device=x.device)
    parent = torch.empty_like(next_token)
    out = mod.causal_conv1d_update(
        x.transpose(1, 2),  # [bs, dim, n]: the view SGLang's GDN backend passes
        conv_window.clone().contiguous(),  # the kernel shifts it in place by the flattened tokens: a copy
        weight.contiguous(), bias, activation,
        conv_state_indices=slots, intermediate_conv_window=windows, intermediate_state_indices=slots,
        retrieve_next_token=next_token.contiguous(), retrieve_next_sibling=next_sibling.contiguous(),
        retrieve_parent_token=parent,
    )
    return out.transpose(1, 2), windows, parent


def tree_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, parents: Tensor,
                          scale: float | None = None, use_qk_l2norm: bool = True) -> tuple[Tensor, Tensor]:
    """SGLang's tree delta rule, called as its GDN backend calls it in TARGET_VERIFY (varlen, one request per
    ``cu_seqlens`` segment, ``disable_state_update``). Shapes as ``gdn_tree.tree_gated_delta_rule``:
    q, k [bs, n, H, Dk]; v [bs, n, HV, Dv]; g, beta [bs, n, HV]; state [bs, HV, Dk, Dv]; parents int64 [bs, n].
    -> out [bs, n, HV, Dv], states [bs, n, HV, Dk, Dv] float32."""
    bs, n, H, Dk = q.shape
    HV, Dv = v.shape[2], v.shape[3]
    mod = load_recurrent(q.device)
    dev = q.device
    slots = torch.arange(bs, dtype=torch.int32, device=dev)
    h0 = state.float().transpose(-1, -2).contiguous()  # [bs, HV, Dv, Dk]: SGLang's ssm_states layout
    buffer = torch.empty(bs, n, HV, Dv, Dk, dtype=torch.float32, device=dev)  # [cache line, step, HV, Dv, Dk]
    o = mod.fused_recurrent_gated_delta_rule_update_fwd(
        q.reshape(1, bs * n, H, Dk).contiguous(), k.reshape(1, bs * n, H, Dk).contiguous(),
        v.reshape(1, bs * n, HV, Dv).contiguous(), g.float().reshape(1, bs * n, HV).contiguous(),
        beta.float().reshape(1, bs * n, HV).contiguous(), Dk ** -0.5 if scale is None else scale,
        h0, slots, use_qk_l2norm_in_kernel=use_qk_l2norm,
        cu_seqlens=torch.arange(0, bs * n + 1, n, dtype=torch.int32, device=dev),
        disable_state_update=True, intermediate_states_buffer=buffer, intermediate_state_indices=slots,
        cache_steps=n, retrieve_parent_token=parents.clamp(min=0).contiguous(),
    )
    return o.reshape(bs, n, HV, Dv), buffer.transpose(-1, -2)


def tree_gated_delta_rule_from_gates(q: Tensor, k: Tensor, v: Tensor, A_log: Tensor, dt_bias: Tensor, a: Tensor,
                                     b: Tensor, state: Tensor, parents: Tensor, scale: float | None = None,
                                     use_qk_l2norm: bool = True) -> tuple[Tensor, Tensor]:
    """SGLang's ``fused_sigmoid_gating_delta_rule_update`` as ``gdn_triton.py::target_verify`` calls it: the gates
    (g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), softplus threshold 20 as torch's) computed in the
    kernel, then the tree delta rule. q, k [bs, n, H, Dk]; v [bs, n, HV, Dv]; A_log, dt_bias [HV]; a, b
    [bs, n, HV]; state [bs, HV, Dk, Dv]; parents int64 [bs, n]. -> out [bs, n, HV, Dv], states [bs, n, HV, Dk, Dv]."""
    bs, n, H, Dk = q.shape
    HV, Dv = v.shape[2], v.shape[3]
    mod = load_gated(q.device)
    dev = q.device
    slots = torch.arange(bs, dtype=torch.int32, device=dev)
    buffer = torch.empty(bs, n, HV, Dv, Dk, dtype=torch.float32, device=dev)
    o = mod.fused_sigmoid_gating_delta_rule_update(
        A_log.float().contiguous(), a.float().reshape(bs * n, HV).contiguous(), dt_bias.float().contiguous(), 1.0, 20.0,
        q.reshape(1, bs * n, H, Dk).contiguous(), k.reshape(1, bs * n, H, Dk).contiguous(),
        v.reshape(1, bs * n, HV, Dv).contiguous(), b.float().reshape(1, bs * n, HV).contiguous(),
        state.float().transpose(-1, -2).contiguous(), slots, scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm,
        cu_seqlens=torch.arange(0, bs * n + 1, n, dtype=torch.int32, device=dev), is_kda=False,
        disable_state_update=True, intermediate_states_buffer=buffer, intermediate_state_indices=slots,
        cache_steps=n, retrieve_parent_token=parents.clamp(min=0).contiguous(),
    )
    return o.reshape(bs, n, HV, Dv), buffer.transpose(-1, -2)
