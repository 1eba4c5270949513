"""Our tree visibility in SGLang's flat tree-mask layouts (``TreeMaskMode`` FULL_MASK and QLEN_ONLY).

FULL_MASK: request b contributes ``n`` rows of ``seq_lens[b] + n`` entries (its whole committed
prefix, then the tree), requests one after another: ``sum(seq_lens) * n + n * n * bs`` entries.
QLEN_ONLY: the ``n x n`` tree part only, ``n * n * bs`` entries.
"""
from __future__ import annotations

import torch
from torch import Tensor

MASK_MODES = ("FULL_MASK", "QLEN_ONLY")


def mask_elements(mode: str, seq_lens, n) -> int:
    """Entries of SGLang's flat mask for one verify batch. seq_lens: committed tokens per request; n: verified
    tokens per request, one count for all or one per request (a ragged batch). For one count this is
    SGLang's ``seq_lens_sum * n + n * n * bs`` (FULL_MASK) and ``n * n * bs`` (QLEN_ONLY)."""
    seq = [int(x) for x in seq_lens]
    ns = [int(x) for x in n] if isinstance(n, (list, tuple)) else [int(n)] * len(seq)
    if mode == "FULL_MASK":
        return sum(k * (s + k) for s, k in zip(seq, ns))
    if mode == "QLEN_ONLY":
        return sum(k * k for k in ns)
    raise ValueError(f"mask mode {mode!r} is not one of {', '.join(MASK_MODES)}")


def flat_tree_mask(visibility: Tensor, seq_lens: Tensor, mode: str) -> Tensor:
    """visibility bool [bs, n, n], seq_lens int [bs] -> bool [mask_elements(mode, seq_lens, n)]."""
    bs, n, _ = visibility.shape
    if mode == "QLEN_ONLY":
        return visibility.reshape(-1).clone()
    size = mask_elements(mode, seq_lens.tolist(), n)
    out = torch.ones(size, dtype=torch.bool, device=visibility.device)  # prefix columns: all visible
    seq = seq_lens.to(visibility.device).long()
    base = n * n * torch.arange(bs, device=seq.device) + n * (torch.cumsum(seq, 0) - seq)  # [bs]
    x = torch.arange(n, device=seq.device)
    # Entry (b, row x, tree column y) = base_b + x * (seq_b + n) + seq_b + y.
    idx = (base + seq)[:, None, None] + x[None, :, None] * (seq + n)[:, None, None] + x[None, None, :]
    out[idx.reshape(-1)] = visibility.reshape(-1)
    return out
