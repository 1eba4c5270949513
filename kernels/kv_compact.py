"""KV-cache compaction after accept: keep the accepted tree rows, contiguous after the prefix."""
from __future__ import annotations

import torch
from torch import Tensor


def compact_kv(kv: Tensor, start: int, accepted: Tensor) -> Tensor:
    """Rows [start, start + n) of ``kv`` held the verified tree; keep the accepted ones.

    kv: [bs, heads, start + n, head_dim]; accepted: int64 [L] node indices (root
    first, as returned by the accept walk, without padding; one request at a
    time since accepted lengths differ). -> [bs, heads, start + L, head_dim]
    """
    rows = accepted.to(kv.device) + start
    return torch.cat([kv[:, :, :start], kv.index_select(2, rows)], dim=2)
