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


def compact_kv_(buf: Tensor, start: int, accepted: Tensor) -> Tensor:
    """In place: ``buf[:, :, start:start + L]`` = the accepted rows, in order; rows past that are left as
    they were (a cache then shortens its length to ``start + L``). Only the L accepted rows are copied.

    buf: [bs, heads, capacity, head_dim]; accepted: int64 [L] node indices, root first. -> buf
    """
    rows = accepted.to(buf.device) + start
    # index_select copies the rows out first, so overlapping source and destination rows are safe.
    buf[:, :, start : start + rows.shape[0]] = buf.index_select(2, rows)
    return buf
