"""Tree build: the N best prefixes of the drafter's per-slot log-probs, as a flattened tree.

A prefix (t1..td) scores sum_i L[i, t_i]. Scores only fall as a prefix grows, so
the N best prefixes form a prefix-closed tree. Ties are broken one way, shared
with the heap oracle: **score descending, then depth ascending, then the parent's
flattened index ascending, then token rank ascending** (token rank = position of
the token in its slot's log-probs sorted descending, equal log-probs ordered by
token id). Every parent therefore precedes its children in the flattened order.

The build is vectorized over the batch and stays on the tensor's device: no host
copy, no Python heap, every shape known from the arguments alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor


@dataclass(frozen=True)
class Tree:
    """A flattened draft tree; index 0 is the root (the bonus token). All fields [bs, n]."""

    tokens: Tensor  # int64 [bs, n]
    parents: Tensor  # int64 [bs, n], -1 at the root
    depth: Tensor  # int64 [bs, n], 0 at the root
    rank: Tensor  # int64 [bs, n], token rank within its slot, 0 at the root
    score: Tensor  # float32 [bs, n], path log-prob, 0 at the root

    @property
    def n(self) -> int:
        return self.tokens.shape[1]

    def __getitem__(self, b: int) -> "Tree":
        return Tree(*(t[b : b + 1] for t in (self.tokens, self.parents, self.depth, self.rank, self.score)))


def sorted_slots(logprobs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k per slot in the documented order (log-prob descending, then token id ascending).

    logprobs: [bs, D, V] -> values [bs, D, k], token ids [bs, D, k]
    """
    # topk alone would not promise an order among equal log-probs, and a full stable sort of the
    # vocabulary costs ~30x more. So rank by one unique int64 key: the float's bits made
    # order-preserving, then the reversed token id (equal log-probs -> lower id first).
    lp = logprobs.float() + 0.0  # -0.0 -> 0.0, so equal floats have equal bits
    V = lp.shape[-1]
    bits = lp.view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()  # monotone in the float value
    key = ordered * V + (V - 1 - torch.arange(V, device=lp.device))
    ids = torch.topk(key, k, dim=-1, sorted=True).indices
    return lp.gather(-1, ids), ids


@lru_cache(maxsize=256)
def _pairs(beam: int, k: int, budget: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Candidate (parent beam position p, token rank j) pairs, row-major, that can reach the top `budget`.

    (p, j) has at least (p+1)(j+1)-1 candidates ahead of it at its depth (all
    (p' <= p, j' <= j)), so only pairs with (p+1)(j+1) <= budget can be kept.
    """
    p = torch.arange(beam, device=device)[:, None].expand(beam, k)
    j = torch.arange(k, device=device)[None, :].expand(beam, k)
    keep = (p + 1) * (j + 1) <= budget
    return p[keep], j[keep]


def build_tree(logprobs: Tensor, root_tokens: Tensor, budget: int, width: int | None = None) -> Tree:
    """The ``budget`` best prefixes of ``logprobs`` as a tree below ``root_tokens``.

    logprobs: [bs, D, V] per-slot log-probs (slot d predicts depth d+1); root_tokens: [bs].
    ``width`` caps the tokens considered per slot (``width=1`` gives the argmax chain).
    Returns a Tree with n = 1 + min(budget, number of distinct prefixes) nodes.
    """
    bs, D, V = logprobs.shape
    device = logprobs.device
    k = min(budget, width or budget, V)
    topv, topi = sorted_slots(logprobs, k)  # [bs, D, k]

    # Per-depth beams, each ordered by (score desc, parent beam position asc, rank asc).
    scores, parent_pos, ranks, tokens, sizes = [], [], [], [], []
    beam_score = topv[:, 0, :k]  # [bs, k]
    scores.append(beam_score)
    parent_pos.append(torch.zeros(bs, k, dtype=torch.long, device=device))
    ranks.append(torch.arange(k, device=device).expand(bs, k))
    tokens.append(topi[:, 0, :k])
    sizes.append(k)
    for d in range(1, D):
        p, j = _pairs(sizes[-1], k, budget, device)
        cand = beam_score[:, p] + topv[:, d, j]  # [bs, n_pairs]
        m = min(budget, cand.shape[1])
        order = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :m]  # [bs, m]
        beam_score = cand.gather(1, order)
        rank = j[order]
        scores.append(beam_score)
        parent_pos.append(p[order])
        ranks.append(rank)
        tokens.append(topi[:, d].gather(1, rank))
        sizes.append(m)

    # Global order: a stable sort over [depth 1 beam; depth 2 beam; ...] realises
    # (score desc, depth asc, within-depth order asc) == the documented tie rule.
    all_scores = torch.cat(scores, dim=1)  # [bs, total]
    total = all_scores.shape[1]
    n_nodes = min(budget, total)
    sel = torch.sort(all_scores, dim=1, descending=True, stable=True).indices[:, :n_nodes]  # [bs, n_nodes]
    flat_index = torch.full((bs, total), -1, dtype=torch.long, device=device)
    flat_index.scatter_(1, sel, torch.arange(1, n_nodes + 1, device=device).expand(bs, n_nodes))

    offsets = [0]
    for s in sizes[:-1]:
        offsets.append(offsets[-1] + s)
    # Parent of a depth-(d+1) entry = flattened index of beam entry (offset_d + p) at depth d.
    parent_entry = torch.cat(
        [torch.full_like(parent_pos[0], -1)] + [parent_pos[d] + offsets[d - 1] for d in range(1, D)], dim=1
    )  # [bs, total]
    parent_flat = torch.where(parent_entry < 0, 0, flat_index.gather(1, parent_entry.clamp(min=0)))
    depth = torch.cat([torch.full_like(parent_pos[d], d + 1) for d in range(D)], dim=1)

    def take(x: Tensor) -> Tensor:
        return x.gather(1, sel)

    root = torch.zeros(bs, 1, dtype=torch.long, device=device)
    return Tree(
        tokens=torch.cat([root_tokens.reshape(bs, 1).long(), take(torch.cat(tokens, dim=1))], dim=1),
        parents=torch.cat([root - 1, take(parent_flat)], dim=1),
        depth=torch.cat([root, take(depth)], dim=1),
        rank=torch.cat([root, take(torch.cat(ranks, dim=1))], dim=1),
        score=torch.cat([root.float(), take(all_scores)], dim=1),
    )


def chain_tree(draft_tokens: Tensor, root_tokens: Tensor, logprobs: Tensor | None = None) -> Tree:
    """Linear DFlash as a tree: root -> d1 -> d2 -> ... (draft_tokens [bs, D])."""
    bs, D = draft_tokens.shape
    device = draft_tokens.device
    idx = torch.arange(D + 1, device=device).expand(bs, D + 1)
    if logprobs is not None:
        step = logprobs.float().gather(2, draft_tokens[..., None])[..., 0]  # [bs, D]
        score = torch.cat([torch.zeros(bs, 1, device=device), step.cumsum(1)], dim=1)
        lp = logprobs.float()
        ids = torch.arange(lp.shape[-1], device=device)
        ahead = (lp > step[..., None]) | ((lp == step[..., None]) & (ids < draft_tokens[..., None]))
        rank = ahead.sum(-1)  # the same order as sorted_slots
        rank = torch.cat([torch.zeros(bs, 1, dtype=torch.long, device=device), rank], dim=1)
    else:
        score = torch.zeros(bs, D + 1, device=device)
        rank = torch.zeros(bs, D + 1, dtype=torch.long, device=device)
    return Tree(
        tokens=torch.cat([root_tokens.reshape(bs, 1).long(), draft_tokens.long()], dim=1),
        parents=idx - 1,
        depth=idx.clone(),
        rank=rank,
        score=score,
    )
