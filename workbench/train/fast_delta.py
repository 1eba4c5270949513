"""A faster chunked gated delta rule for *training* the hybrid target on a CPU.

transformers' torch fallback for GatedDeltaNet (``torch_chunk_gated_delta_rule`` in
``models/qwen3_5``) solves each chunk's unit lower-triangular system row by row, in a Python
loop of ``chunk_size`` steps; under autograd that loop costs more than the rest of the
model's step. The same system is solved here by one ``torch.linalg.solve_triangular``.
Same math, same signature, same result to float32 rounding (``tests/train/test_train_hybrid.py``);
the trained weights are plain Qwen3.5 weights that transformers' own path runs.

Per head, with state S [dk, dv], log-decay g_t and write strength beta_t (HF's recurrent form):
    S_t = e^{g_t} S_{t-1} + k_t delta_t^T,  delta_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t),  o_t = S_t^T q_t
Inside a chunk, with cumulative log-decay G_i = g_1 + ... + g_i and S0 the chunk's initial state:
    (I + L) delta = beta v - (beta e^G k) S0,   L_ij = beta_i e^{G_i - G_j} k_i.k_j  (j < i)
    o_i = e^{G_i} q_i^T S0 + sum_{j <= i} e^{G_i - G_j} (q_i.k_j) delta_j
    S_C = e^{G_C} S0 + sum_j e^{G_C - G_j} k_j delta_j^T
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)  # as HF's l2norm (FLA's)


def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size: int = 64, initial_state=None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, **_):
    """HF's ``torch_chunk_gated_delta_rule`` contract: query/key [b, T, h, dk], value [b, T, h, dv],
    g/beta [b, T, h] -> (out [b, T, h, dv] in query's dtype, final state [b, h, dk, dv] or None)."""
    dtype = query.dtype
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    q, k, v, b, g = (x.transpose(1, 2).float() for x in (query, key, value, beta, g))  # heads first
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    C = chunk_size
    pad = (-T) % C  # padded steps have k = v = beta = g = 0: they leave the state as it is
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        b, g = F.pad(b, (0, pad)), F.pad(g, (0, pad))
    n = (T + pad) // C
    q = q * dk ** -0.5
    q, k, v = (x.reshape(B, H, n, C, -1) for x in (q, k, v))  # [B, H, n, C, d]
    b, g = b.reshape(B, H, n, C), g.reshape(B, H, n, C)
    G = g.cumsum(-1)  # [B, H, n, C]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    # e^{G_i - G_j} for j <= i, 0 above (masked before exp: G_i - G_j > 0 there could overflow)
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # [B, H, n, C, C]
    lower = (b[..., :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    system = lower + torch.eye(C, device=q.device)
    rhs = torch.cat([b[..., None] * v, b[..., None] * G.exp()[..., None] * k], dim=-1)  # [B, H, n, C, dv + dk]
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u, w = solved[..., :dv], solved[..., dv:]  # delta = u - w @ S0
    qk = (q @ k.transpose(-1, -2)) * decay  # [B, H, n, C, C]
    S = (torch.zeros(B, H, dk, dv, device=q.device) if initial_state is None
         else initial_state.to(device=q.device, dtype=torch.float32))
    outs = []
    for i in range(n):  # chunks in order: each starts from the state the last one left
        delta = u[:, :, i] - w[:, :, i] @ S  # [B, H, C, dv]
        outs.append((q[:, :, i] * G[:, :, i, :, None].exp()) @ S + qk[:, :, i] @ delta)
        last = G[:, :, i, -1]  # [B, H]
        S = S * last.exp()[..., None, None] + (k[:, :, i] * (last[..., None] - G[:, :, i]).exp()[..., None]
                                               ).transpose(-1, -2) @ delta
    out = torch.stack(outs, dim=2).reshape(B, H, n * C, dv)[:, :, :T]
    return out.transpose(1, 2).contiguous().to(dtype), (S if output_final_state else None)


@contextmanager
def fast_delta_rule():
    """Inside: transformers' Qwen3.5 GatedDeltaNet layers use ``chunk_gated_delta_rule`` above
    for their chunked (multi-token) path; restored on exit, whatever happens."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

    original = mq.torch_chunk_gated_delta_rule
    mq.torch_chunk_gated_delta_rule = chunk_gated_delta_rule
    try:
        yield
    finally:
        mq.torch_chunk_gated_delta_rule = original
