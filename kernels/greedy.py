"""The target's greedy choice at every verified node, and its two best tokens (kept for the records).

Oracle: ``logits.argmax(-1)`` (the first of equal maxima, as plain greedy decoding takes). On a CPU an
argmax over the vocabulary costs about as much as the top-2 the records need anyway, so there the
choice is read off the top-2 whenever no node has two equal best logits (then the top-2's first is the
unique maximum); a tie anywhere falls back to argmax. Other devices, and callers that must not read
values on the host (static shapes, CUDA graphs), always take argmax.
"""
from __future__ import annotations

from torch import Tensor


def greedy_choice(logits: Tensor, sync_free: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """logits [..., V] -> (choice int64 [...], top-2 logits [..., 2], top-2 tokens int64 [..., 2])."""
    top2 = logits.topk(2, dim=-1)
    if sync_free or logits.device.type != "cpu":
        return logits.argmax(-1), top2.values, top2.indices
    v = top2.values
    if bool((v[..., 0] == v[..., 1]).any()):  # topk promises no order among equal values
        return logits.argmax(-1), top2.values, top2.indices
    return top2.indices[..., 0], top2.values, top2.indices
