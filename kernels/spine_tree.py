"""Spine tree: the drafter's top-1 chain plus its ``siblings`` best runner-up tokens, as a flattened tree.

The chain is the rank-0 token of every slot (``sorted_slots``' order: log-prob descending, equal
log-probs by token id, so the chain is ``argmax``'s and ``chain_tree``'s). The siblings are the
``siblings`` best tokens of rank >= 1 over all slots, by the drafter's own log-prob for the slot (not
the path's): a sibling from slot d (predicting depth d + 1) is a leaf child of the chain node at depth
d, beside the chain's token there. Ties: log-prob descending, then slot ascending, then rank ascending.

Node order: the root, the chain by depth, then the siblings in the order they were picked. Every shape
follows from the arguments, and nothing reads the device: the same code runs on a CPU and a GPU.
``siblings=0`` is the chain alone (linear DFlash).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ddtree_kernels.tree_build import Tree, top_slots


def spine_tree(logprobs: Tensor, root_tokens: Tensor, siblings: int) -> Tree:
    """logprobs [bs, D, V] per-slot log-probs, root_tokens [bs] -> the spine tree (n = 1 + D + min(siblings,
    D * (V - 1)) nodes)."""
    return spine_tree_from_topk(*top_slots(logprobs, min(siblings + 1, logprobs.shape[-1])), root_tokens, siblings)


def spine_tree_from_topk(topv: Tensor, topi: Tensor, root_tokens: Tensor, siblings: int) -> Tree:
    """``spine_tree`` after ``sorted_slots``: topv/topi [bs, D, w] in the documented order, w >= 1 (only the
    first ``siblings + 1`` ranks per slot are read)."""
    bs, D, w = topv.shape
    w = min(w, siblings + 1)
    dev = topv.device
    m = min(siblings, D * (w - 1))  # siblings there are
    chain_score = topv[:, :, 0].double().cumsum(1)  # [bs, D] path log-prob of each chain node
    idx = torch.arange(D + 1, device=dev).expand(bs, D + 1)
    zero = torch.zeros(bs, 1, dtype=torch.long, device=dev)
    tokens = [root_tokens.reshape(bs, 1).long(), topi[:, :, 0].long()]
    parents, depth = [idx - 1], [idx.clone()]
    rank = [torch.zeros(bs, D + 1, dtype=torch.long, device=dev)]
    score = [zero.double(), chain_score]
    if m:
        cand = topv[:, :, 1:w].double().reshape(bs, D * (w - 1))  # flat index = slot * (w - 1) + rank - 1
        pick = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :m]  # [bs, m]: ties by index
        slot = pick // (w - 1)
        tokens.append(topi[:, :, 1:w].reshape(bs, D * (w - 1)).gather(1, pick).long())
        parents.append(slot)  # the chain node at depth `slot` is node `slot`
        depth.append(slot + 1)
        rank.append(pick % (w - 1) + 1)
        score.append(torch.cat([zero.double(), chain_score], dim=1).gather(1, slot) + cand.gather(1, pick))
    return Tree(*(torch.cat(f, dim=1) for f in (tokens, parents, depth, rank, score)))
