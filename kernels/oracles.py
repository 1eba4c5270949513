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
    # Rank order per slot: log-prob descending, token id ascending.
    order = [sorted(range(V), key=lambda t, row=row: (-row[t], t))[:k] for row in lp]
    tokens, parents, depth, rank, score = [int(root_token)], [-1], [0], [0], [np.float32(0.0)]
    heap = [(-np.float32(lp[0][order[0][0]]), 1, 0, 0, np.float32(0.0))]
    while heap and len(tokens) <= budget:
        neg, d, par, r, par_score = heapq.heappop(heap)
        s = np.float32(-neg)
        idx = len(tokens)
        tokens.append(order[d - 1][r])
        parents.append(par)
        depth.append(d)
        rank.append(r)
        score.append(s)
        if r + 1 < k:
            sib = np.float32(par_score + np.float32(lp[d - 1][order[d - 1][r + 1]]))
            heapq.heappush(heap, (-sib, d, par, r + 1, par_score))
        if d < D:
            child = np.float32(s + np.float32(lp[d][order[d][0]]))
            heapq.heappush(heap, (-child, d + 1, idx, 0, s))
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
