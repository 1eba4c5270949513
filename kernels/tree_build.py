"""Tree build: the N best prefixes of the drafter's per-slot log-probs, as a flattened tree.

A prefix (t1..td) scores sum_i L[i, t_i], summed in float64 (the paper's reference sums
Python floats too; in float32, sums of different paths that differ in their last bits
collapse or swap). Scores only fall as a prefix grows, so the N best prefixes form a
prefix-closed tree. Ties are broken by one rule, shared by both builds and the
independent oracle (``oracles.build_tree_greedy_exact``): nodes are taken one at a time,
each the best candidate whose parent is already in the tree by **score descending, then
depth ascending, then the parent's flattened index ascending, then token rank
ascending** (token rank = position of the token in its slot's log-probs sorted
descending, equal log-probs ordered by token id). Every parent therefore precedes its
children in the flattened order, and -inf log-probs (masked tokens) are ordinary ties.

Relation to the paper's reference heap: the same tree and order whenever no two
candidate scores tie; on ties the reference orders by the rank path (lexicographic
tuple of ranks from the root) and takes equal log-probs in ``torch.topk``'s order,
which nothing promises, so both give a valid best-N tree but may keep different
nodes at a tied budget boundary.

Two builds give the same tree. On a GPU the build is vectorized over the batch and
stays on the device: per-depth beams, every shape known from the arguments alone, no
host synchronisation (``tests/kernels/test_sync_free.py``, ``tests/gpu/``). On a CPU, where a
tensor call costs microseconds and nothing waits for a device, a best-first heap over
the top-k per slot is cheaper at every budget (``workbench kernels`` measures both).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class Tree:
    """A flattened draft tree; index 0 is the root (the bonus token). All fields [bs, n]."""

    tokens: Tensor  # int64 [bs, n]
    parents: Tensor  # int64 [bs, n], -1 at the root
    depth: Tensor  # int64 [bs, n], 0 at the root
    rank: Tensor  # int64 [bs, n], token rank within its slot, 0 at the root
    score: Tensor  # float64 [bs, n], path log-prob (summed in float64), 0 at the root

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
    # order-preserving (flip the magnitude bits of negatives), then the reversed token id. -0.0 ranks
    # just below +0.0; a log-prob row cannot hold both (two tokens of probability 1).
    lp = logprobs.float()
    V = lp.shape[-1]
    bits = lp.view(torch.int32)
    ordered = bits ^ (bits >> 31).bitwise_and_(0x7FFFFFFF)  # [bs, D, V] int32, monotone in the value
    key = torch.add(_reversed_ids(V, lp.device), ordered, alpha=V)  # int64: the value, then the lower id
    ids = torch.topk(key, k, dim=-1, sorted=True).indices
    return lp.gather(-1, ids), ids


def top_slots(logprobs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``sorted_slots`` by the cheapest exact route for the tensor's device."""
    return _sorted_slots_host(logprobs, k) if logprobs.device.type == "cpu" else sorted_slots(logprobs, k)


def _sorted_slots_host(logprobs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """On a CPU a plain top-k is exact whenever no two of the k + 1 best log-probs of a slot are equal
    (then neither the order nor the k-th place is a tie); only otherwise is the int64 key needed.
    Up to 64 the (k + 1)-th comes from the same top-k call; past 64 a CPU top-k takes another, about 4x
    slower, algorithm, so the k-th place is checked by counting the log-probs at or above it instead."""
    lp = logprobs.float()
    V = lp.shape[-1]
    if k + 1 <= TOPK_FAST or k >= V:
        v, i = torch.topk(lp, min(k + 1, V), dim=-1, sorted=True)
        vn = v.numpy()
        if (vn[..., 1:] < vn[..., :-1]).all():
            return v[..., :k], i[..., :k]
        return sorted_slots(lp, k)
    v, i = torch.topk(lp, k, dim=-1, sorted=True)
    vn = v.numpy()
    if (vn[..., 1:] < vn[..., :-1]).all() and bool(((lp >= v[..., -1:]).sum(-1) == k).all()):
        return v, i
    return sorted_slots(lp, k)


TOPK_FAST = 64  # the largest k a CPU top-k over a vocabulary row serves with its fast algorithm


@lru_cache(maxsize=64)
def _reversed_ids(V: int, device: torch.device) -> Tensor:
    return torch.arange(V - 1, -1, -1, device=device)


def _pair_count(beam: int, k: int, budget: int) -> int:
    return sum(min(k, budget // (p + 1)) for p in range(beam))


@lru_cache(maxsize=256)
def beam_sizes(D: int, k: int, budget: int) -> tuple[int, ...]:
    """Entries kept per depth: the k tokens of slot 0, then at most ``budget`` (no more than exist)."""
    sizes = [k]
    for _ in range(1, D):
        sizes.append(min(budget, _pair_count(sizes[-1], k, budget)))
    return tuple(sizes)


@lru_cache(maxsize=256)
def _pairs(beam: int, k: int, budget: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Candidate (parent beam position p, token rank j) pairs, row-major, that can reach the top `budget`.

    (p, j) has at least (p+1)(j+1)-1 candidates ahead of it at its depth (all
    (p' <= p, j' <= j)), so only pairs with (p+1)(j+1) <= budget can be kept: row p
    holds ranks 0 .. min(k, budget // (p+1)) - 1. Computed on the device from shapes
    known on the host, so nothing waits for the device (no boolean indexing).
    """
    counts = (budget // (torch.arange(beam, device=device) + 1)).clamp(max=k)  # [beam]
    total = _pair_count(beam, k, budget)
    p = torch.repeat_interleave(torch.arange(beam, device=device), counts, output_size=total)  # [total]
    starts = counts.cumsum(0) - counts
    return p, torch.arange(total, device=device) - starts[p]


def top_desc(x: Tensor, m: int) -> Tensor:
    """[bs, n] -> [bs, m] indices of the m largest, value descending, equal values by index."""
    return torch.sort(x, dim=1, descending=True, stable=True).indices[:, :m]


def build_tree(logprobs: Tensor, root_tokens: Tensor, budget: int, width: int | None = None) -> Tree:
    """The ``budget`` best prefixes of ``logprobs`` as a tree below ``root_tokens``.

    logprobs: [bs, D, V] per-slot log-probs (slot d predicts depth d+1); root_tokens: [bs].
    ``width`` caps the tokens considered per slot (``width=1`` gives the argmax chain).
    Returns a Tree with n = 1 + min(budget, number of distinct prefixes) nodes.
    """
    k = min(budget, width or budget, logprobs.shape[-1])
    return build_tree_from_topk(*top_slots(logprobs, k), root_tokens, budget)


def build_tree_from_topk(topv: Tensor, topi: Tensor, root_tokens: Tensor, budget: int) -> Tree:
    """``build_tree`` after ``sorted_slots``: topv/topi [bs, D, k] in the documented order.

    Two implementations with one result: on a CPU a best-first heap over the top-k (the build is a
    chain of small steps, and a heap's Python steps cost less than tensor calls); on other devices
    ``build_tree_vectorized``, which never waits for the device (the tests compare the two).
    """
    if topv.device.type == "cpu":
        return heap_build(topv, topi, root_tokens, budget)
    return build_tree_vectorized(topv, topi, root_tokens, budget)


def build_tree_vectorized(topv: Tensor, topi: Tensor, root_tokens: Tensor, budget: int) -> Tree:
    """The device build: per-depth beams, every shape known from the arguments alone, no host sync."""
    bs, D, k = topv.shape
    dev = topv.device
    topv = topv.double()  # path sums in float64: the order of the heap build and of the reference
    sizes = beam_sizes(D, k, budget)
    # Per-depth beams, each ordered by (score desc, parent beam position asc, rank asc). Only the
    # scores go through the sequential loop; the rest is gathered once after it.
    beam = topv[:, 0]  # [bs, k]
    rank0 = torch.arange(k, device=dev).expand(bs, k)
    scores, parent, rank = [beam], [torch.full_like(rank0, -1)], [rank0]  # parent: beam entry, -1 = root
    offset = 0
    for d in range(1, D):
        p, j = _pairs(sizes[d - 1], k, budget, dev)
        cand = beam[:, p] + topv[:, d, j]  # [bs, n_pairs]
        order = top_desc(cand, sizes[d])  # [bs, m]
        beam = cand.gather(1, order)
        scores.append(beam)
        parent.append(p[order] + offset)
        rank.append(j[order])
        offset += sizes[d - 1]

    return tree_from_beams(root_tokens, topi, sizes, scores, parent, rank, budget)


def tree_from_beams(root_tokens: Tensor, topi: Tensor, sizes: tuple, scores: list, parents: list, ranks: list,
                    budget: int) -> Tree:
    """Per-depth beams -> the tree of their ``budget`` best entries (every vectorised build ends here).

    scores / parents / ranks: one [bs, m_d] tensor per depth d = 1..D (``sizes[d - 1]`` = m_d): each entry's path
    score, the global beam entry of its parent (-1 at depth 1) and its token's rank in its slot; topi [bs, D, k].
    A stable sort over [depth-1 beam; depth-2 beam; ...] is (score desc, depth asc, the beam's own order): the
    documented tie rule, and a parent always precedes its children."""
    bs, D, k = topi.shape
    dev = topi.device
    all_scores = torch.cat(scores, dim=1)  # [bs, total]
    total = all_scores.shape[1]
    n = min(budget, total)
    sel = top_desc(all_scores, n)  # [bs, n]: beam entries in node order
    node_of = torch.zeros(bs, total + 1, dtype=torch.long, device=dev)  # entry + 1 -> node (0: the root)
    node_of.scatter_(1, sel + 1, torch.arange(1, n + 1, device=dev).expand(bs, n))
    depth = entry_depths(sizes, dev)[sel]  # [bs, n]
    rank = torch.cat(ranks, dim=1).gather(1, sel)  # [bs, n]
    root = torch.zeros(bs, 1, dtype=torch.long, device=dev)
    return Tree(
        tokens=torch.cat([root_tokens.reshape(bs, 1).long(), topi.reshape(bs, D * k).gather(1, (depth - 1) * k + rank)],
                         dim=1),
        parents=torch.cat([root - 1, node_of.gather(1, torch.cat(parents, dim=1).gather(1, sel) + 1)], dim=1),
        depth=torch.cat([root, depth], dim=1),
        rank=torch.cat([root, rank], dim=1),
        score=torch.cat([root.double(), all_scores.gather(1, sel)], dim=1),
    )


@lru_cache(maxsize=512)
def entry_depths(sizes: tuple, device: torch.device) -> Tensor:
    """[total] the depth (1-based) of every beam entry, depth by depth (fills: no host-to-device copy)."""
    return torch.cat([torch.full((s,), d + 1, dtype=torch.long, device=device) for d, s in enumerate(sizes)])


def heap_build(topv: Tensor, topi: Tensor, root_tokens: Tensor, budget: int) -> Tree:
    """The host path of ``build_tree_from_topk``: one heap walk per request (``heap_tree_lists``)."""
    vals, ids = topv.tolist(), topi.tolist()  # Python floats: float64 sums, and cheap heap compares
    roots = root_tokens.reshape(-1).tolist()
    rows = [heap_tree_lists(vals[b], ids[b], roots[b], budget) for b in range(len(roots))]
    cols = [torch.from_numpy(np.array([r[f] for r in rows], dtype=np.int64)) for f in range(4)]
    return Tree(*cols, torch.from_numpy(np.array([r[4] for r in rows], dtype=np.float64)))


def heap_tree_lists(vals, ids, root_token: int, budget: int) -> tuple[list, list, list, list, list]:
    """Best-first heap over one request's per-slot top-k (vals/ids: nested lists [D][k] of Python
    floats / ints, each row in the documented order). Pop the best prefix, make it a node, push its
    next sibling (same slot, next rank) and its first child (next slot, rank 0). The heap key
    (-score, depth, parent, rank), scores summed in float64, is the documented tie rule.
    -> tokens, parents, depth, rank, score lists, root first."""
    D, k = len(vals), len(vals[0])
    tokens, parents, depth, rank, score = [root_token], [-1], [0], [0], [0.0]
    heap = [(-vals[0][0], 1, 0, 0, 0.0)]
    while heap and len(tokens) <= budget:
        neg, d, par, r, par_score = heapq.heappop(heap)
        s = -neg
        idx = len(tokens)
        tokens.append(ids[d - 1][r])
        parents.append(par)
        depth.append(d)
        rank.append(r)
        score.append(s)
        if r + 1 < k:
            heapq.heappush(heap, (-(par_score + vals[d - 1][r + 1]), d, par, r + 1, par_score))
        if d < D:
            heapq.heappush(heap, (-(s + vals[d][0]), d + 1, idx, 0, s))
    return tokens, parents, depth, rank, score


def chain_tree(draft_tokens: Tensor, root_tokens: Tensor, logprobs: Tensor | None = None) -> Tree:
    """Linear DFlash as a tree: root -> d1 -> d2 -> ... (draft_tokens [bs, D])."""
    bs, D = draft_tokens.shape
    device = draft_tokens.device
    idx = torch.arange(D + 1, device=device).expand(bs, D + 1)
    if logprobs is not None:
        step = logprobs.float().gather(2, draft_tokens[..., None])[..., 0]  # [bs, D]
        score = torch.cat([torch.zeros(bs, 1, dtype=torch.float64, device=device), step.double().cumsum(1)], dim=1)
        lp = logprobs.float()
        ids = torch.arange(lp.shape[-1], device=device)
        ahead = (lp > step[..., None]) | ((lp == step[..., None]) & (ids < draft_tokens[..., None]))
        rank = ahead.sum(-1)  # the same order as sorted_slots
        rank = torch.cat([torch.zeros(bs, 1, dtype=torch.long, device=device), rank], dim=1)
    else:
        score = torch.zeros(bs, D + 1, dtype=torch.float64, device=device)
        rank = torch.zeros(bs, D + 1, dtype=torch.long, device=device)
    return Tree(
        tokens=torch.cat([root_tokens.reshape(bs, 1).long(), draft_tokens.long()], dim=1),
        parents=idx - 1,
        depth=idx.clone(),
        rank=rank,
        score=score,
    )
