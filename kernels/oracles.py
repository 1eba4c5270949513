"""Independent reference implementations, used only by the parity tests and benchmarks.

They are written the plain way (a heap, a Python walk, a loop) so that a bug in
the vectorized kernels cannot hide in shared code.
"""
from __future__ import annotations

import heapq

import numpy as np
import torch
from torch import Tensor


def build_tree_heap(logprobs: Tensor, root_token: int, budget: int, width: int | None = None):
    """Best-first heap build for one request (logprobs [D, V]).

    Heap key = (-score, depth, parent index, rank): the documented tie rule.
    Scores are float32 sums, as in the vectorized build. Returns a dict of lists.
    """
    lp = logprobs.detach().float().cpu().numpy()
    D, V = lp.shape
    k = min(budget, width or budget, V)
    # Rank order per slot: log-prob descending, token id ascending (a plain sort, not the kernels' key).
    order = np.array([sorted(range(V), key=lambda t, row=row: (-row[t], t))[:k] for row in lp])  # [D, k]
    vals = np.take_along_axis(lp, order, axis=1)
    tokens, parents, depth, rank, score = heap_tree_lists(vals, order, int(root_token), budget)
    return {"tokens": tokens, "parents": parents, "depth": depth, "rank": rank,
            "score": [float(x) for x in score]}


def accept_walk_python(tokens, parents, choice):
    """Walk one request's tree from the root: follow the child whose token is the target's choice."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            children.setdefault(p, []).append(i)
    path = [0]
    while True:
        want = choice[path[-1]]
        nxt = [c for c in children.get(path[-1], []) if tokens[c] == want]
        if not nxt:
            break
        path.append(nxt[0])
    return path, choice[path[-1]]


def ancestors_python(parents) -> list[set[int]]:
    out = []
    for i in range(len(parents)):
        s, j = {i}, parents[i]
        while j >= 0:
            s.add(j)
            j = parents[j]
        out.append(s)
    return out


def compact_kv_loop(kv: Tensor, start: int, accepted) -> Tensor:
    out = kv[:, :, :start].clone()
    rows = [kv[:, :, start + int(i) : start + int(i) + 1] for i in accepted]
    return torch.cat([out, *rows], dim=2)


def heap_tree_lists(vals, ids, root_token: int, budget: int) -> tuple[list, list, list, list, list]:
    """Best-first heap over one request's per-slot top-k (vals/ids: NumPy [D, k], each row sorted
    descending). -> tokens, parents, depth, rank, score lists, root first."""
    D, k = vals.shape
    tokens, parents, depth, rank, score = [root_token], [-1], [0], [0], [np.float32(0.0)]
    heap = [(-vals[0, 0], 1, 0, 0, np.float32(0.0))]
    while heap and len(tokens) <= budget:
        neg, d, par, r, par_score = heapq.heappop(heap)
        s = -neg
        idx = len(tokens)
        tokens.append(int(ids[d - 1, r]))
        parents.append(par)
        depth.append(d)
        rank.append(r)
        score.append(s)
        if r + 1 < k:
            heapq.heappush(heap, (-(par_score + vals[d - 1, r + 1]), d, par, r + 1, par_score))
        if d < D:
            heapq.heappush(heap, (-(s + vals[d, 0]), d + 1, idx, 0, s))
    return tokens, parents, depth, rank, score


def build_tree_host_heap(logprobs: Tensor, root_tokens: Tensor, budget: int, width: int | None = None):
    """The plain way a single-request engine builds a DDTree: top-k per slot on the device, one copy to
    the host, a Python best-first heap, the tree copied back. The speed baseline for ``build_tree``.

    logprobs [bs, D, V] -> Tree (the same as ``build_tree`` when no two log-probs tie at a slot's top-k
    boundary; ties inside the top-k follow torch.topk's order, which nothing promises).
    """
    from ddtree_kernels.tree_build import Tree

    bs, D, V = logprobs.shape
    k = min(budget, width or budget, V)
    top = torch.topk(logprobs.float(), k, dim=-1)
    vals, ids = top.values.cpu().numpy(), top.indices.cpu().numpy()  # [bs, D, k]
    roots = root_tokens.reshape(-1).tolist()
    rows = [heap_tree_lists(vals[b], ids[b], roots[b], budget) for b in range(bs)]
    dev = logprobs.device
    cols = [torch.tensor(np.array([r[f] for r in rows]), device=dev) for f in range(4)]
    return Tree(*cols, torch.tensor(np.array([r[4] for r in rows], dtype=np.float32), device=dev))
