"""Independent reference implementations, used only by the parity tests and benchmarks.

They are written the plain way (a heap, a Python walk, a loop) so that a bug in
the vectorized kernels cannot hide in shared code.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from ddtree_kernels.tree_build import heap_tree_lists  # noqa: F401 - the reference decoder's heap


def build_tree_greedy_exact(logprobs: Tensor, root_token: int, budget: int, width: int | None = None) -> dict:
    """The documented tree for one request (logprobs [D, V]), by the rule's own words, with exact sums.

    Path scores are exact rational sums of the float32 log-probs (``fractions.Fraction``; -inf stays
    -inf), so no rounding can tie or reorder them. Nodes are taken one at a time: among all
    candidates whose parent is already a node (every child of every node, none skipped), the best by
    (score descending, depth ascending, parent index ascending, rank ascending). A linear scan,
    no heap and no code shared with ``ddtree_kernels.tree_build``. Returns a dict of lists, root first.
    """
    lp = logprobs.detach().float().cpu().tolist()
    D, V = len(lp), len(lp[0])
    k = min(budget, width or budget, V)
    # Rank order per slot: log-prob descending, token id ascending (a plain sort, not the kernels' key).
    order = [sorted(range(V), key=lambda t, row=row: (-row[t], t))[:k] for row in lp]  # [D][k]

    def exact(x: float):
        return Fraction(x) if math.isfinite(x) else x

    tree = {"tokens": [int(root_token)], "parents": [-1], "depth": [0], "rank": [0], "score": [Fraction(0)]}
    cands = {}  # (parent node, rank) -> sort key

    def add_children(node: int) -> None:
        d = tree["depth"][node]
        if d < D:
            for r in range(k):
                s = tree["score"][node] + exact(lp[d][order[d][r]])
                cands[node, r] = (-s, d + 1, node, r, s)

    add_children(0)
    while cands and len(tree["tokens"]) <= budget:
        (par, r), (_, d, _, _, s) = min(cands.items(), key=lambda kv: kv[1][:4])
        del cands[par, r]
        tree["tokens"].append(order[d - 1][r])
        tree["parents"].append(par)
        tree["depth"].append(d)
        tree["rank"].append(r)
        tree["score"].append(s)
        add_children(len(tree["tokens"]) - 1)
    tree["score"] = [float(x) for x in tree["score"]]
    return tree


def build_tree_heap(logprobs: Tensor, root_token: int, budget: int, width: int | None = None):
    """Alias kept for the parity tests: the tree of ``build_tree_greedy_exact``."""
    return build_tree_greedy_exact(logprobs, root_token, budget, width)


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


def build_tree_host_heap(logprobs: Tensor, root_tokens: Tensor, budget: int, width: int | None = None):
    """The plain way a single-request engine builds a DDTree: top-k per slot on the device, one copy to
    the host, a Python best-first heap, the tree copied back. The speed baseline for ``build_tree``.

    logprobs [bs, D, V] -> Tree (the same as ``build_tree`` when no two log-probs tie at a slot's top-k
    boundary; ties inside the top-k follow torch.topk's order, which nothing promises).
    """
    from ddtree_kernels.tree_build import Tree, heap_build

    k = min(budget, width or budget, logprobs.shape[-1])
    top = torch.topk(logprobs.float(), k, dim=-1)
    tree = heap_build(top.values.cpu(), top.indices.cpu(), root_tokens.cpu(), budget)
    return Tree(*(t.to(logprobs.device) for t in (tree.tokens, tree.parents, tree.depth, tree.rank, tree.score)))


def eagle_select_python(logprobs: Tensor, topk: int, steps: int, num_draft_tokens: int) -> dict:
    """SGLang's EAGLE selection for one request (logprobs [D, V]), step by step with Python lists.

    Candidates carry SGLang's flat ids; ties: score descending, then id ascending.
    Returns parent_list, selected_index and the Tree fields of the drafted nodes.
    """
    lp = logprobs.detach().float().cpu().numpy()
    order = [sorted(range(lp.shape[1]), key=lambda t, row=row: (-row[t], t))[:topk] for row in lp[:steps]]
    cands = []  # (id, score, token, rank, parent id, depth)
    beam = []  # (score, id)
    for j in range(topk):
        s = np.float32(lp[0][order[0][j]])
        cands.append((j, s, order[0][j], j, -1, 1))
        beam.append((s, j))
    parent_list = [-1] + list(range(topk))
    for i in range(1, steps):
        offset = topk + topk * topk * (i - 1)
        step = []
        for p, (ps, pid) in enumerate(beam):
            for j in range(topk):
                s = np.float32(ps + np.float32(lp[i][order[i][j]]))
                cid = offset + p * topk + j
                cands.append((cid, s, order[i][j], j, pid, i + 1))
                step.append((s, cid))
        beam = sorted(step, key=lambda x: (-x[0], x[1]))[:topk]
        if i < steps - 1:
            parent_list += [cid for _, cid in beam]
    chosen = sorted(sorted(cands, key=lambda c: (-c[1], c[0]))[: num_draft_tokens - 1], key=lambda c: c[0])
    where = {c[0]: i + 1 for i, c in enumerate(chosen)}
    return {
        "parent_list": parent_list if steps > 1 else [],
        "selected_index": [c[0] for c in chosen],
        "tokens": [c[2] for c in chosen],
        "parents": [0 if c[4] < 0 else where[c[4]] for c in chosen],
        "depth": [c[5] for c in chosen],
        "rank": [c[3] for c in chosen],
        "score": [float(c[1]) for c in chosen],
    }


def compile_sglang_python(parents, seq_len: int) -> dict:
    """What SGLang's build kernel writes for one request, from the parent list (root first), as lists:
    positions, retrieve_next_token / _sibling (children linked in descending-index insertion), and the
    tree part of the mask row by row (ancestor-or-self)."""
    n = len(parents)
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    nxt, sib = [-1] * n, [-1] * n
    for i in range(n - 1, 0, -1):  # as the kernel: walk backwards, push i in front of its parent's list
        p = parents[i]
        if nxt[p] != -1:
            sib[i] = nxt[p]
        nxt[p] = i
    anc = ancestors_python(parents)
    return {"positions": [seq_len + d for d in depth], "next_token": nxt, "next_sibling": sib,
            "mask": [[j in anc[i] for j in range(n)] for i in range(n)]}


def spine_tree_python(logprobs: Tensor, root_token: int, siblings: int) -> dict:
    """``spine_tree`` for one request ([D, V] log-probs) in plain Python: sort every slot by (log-prob
    descending, token id), chain the first of each, then take the ``siblings`` best (log-prob, slot, rank)
    of the rest, each a leaf under the chain node at its slot's depth."""
    rows = logprobs.double().tolist()
    ranked = [sorted(range(len(row)), key=lambda t, row=row: (-row[t], t)) for row in rows]
    out = {"tokens": [root_token], "parents": [-1], "depth": [0], "rank": [0], "score": [0.0]}
    chain_score = [0.0]
    for d, order in enumerate(ranked):
        chain_score.append(chain_score[-1] + rows[d][order[0]])
        for key, v in zip(out, (order[0], d, d + 1, 0, chain_score[-1])):
            out[key].append(v)
    cands = sorted((-rows[d][order[r]], d, r, order[r]) for d, order in enumerate(ranked) for r in range(1, len(order)))
    for neg, d, r, tok in cands[:siblings]:
        for key, v in zip(out, (tok, d, d + 1, r, chain_score[d] - neg)):
            out[key].append(v)
    return out
