"""Path-conditioned tree build: the N best prefixes when what a candidate adds depends on its branch.

DDTree scores a prefix by the sum of each slot's own log-prob, whatever branch the token sits on. A
block-diffusion drafter's later slots are drafted along its own argmax path, so once a path leaves that path
(takes a rank >= 1 candidate, a "sibling") the slots below it are right far less often. Here each candidate
adds an increment that depends on its slot, its rank and the *state* of its parent's path:

- ``SPINE``: every node from the root to the parent is its slot's top-1 (the root counts as spine);
- ``SIBLING``: the parent itself is a rank >= 1 candidate;
- ``OFF``: the parent is a top-1, but an earlier node of the path was a sibling.

A child's state follows from its parent's and its own rank (``child_state``). More generally a node hands its
children a *class* (``child_class(parent_class, rank)``; the root's is ``root_class``) and increments are given
per class: ``lambda c, r: r`` makes the class the parent's own rank, so a candidate's increment can depend on
the parent's token (a previous-token-conditioned score). Increments are log-probabilities (<= 0), so a
prefix's score (their sum, float64) never rises as it grows: the N best prefixes form a prefix-closed tree,
as in DDTree.

Tie rule, shared by both builds: nodes are taken one at a time, the best candidate whose parent is already in
the tree by **score descending, then depth ascending, then the parent's index ascending, then the candidate's
position among its siblings** (siblings under one parent ordered by increment descending, equal increments by
rank ascending). ``path_tree_heap`` is the host build (a best-first heap, cheapest on a CPU);
``path_tree_vectorized`` keeps per-depth beams on the device, every shape known from the arguments alone, and
never waits for the device (static shapes, CUDA graphs). The two give the same tree
(``tests/kernels/test_path_tree.py``).
"""
from __future__ import annotations

import heapq

import numpy as np
import torch
from torch import Tensor

from ddtree_kernels.tree_build import Tree, tree_from_beams

SPINE, SIBLING, OFF = 0, 1, 2
STATES = ("spine", "sibling", "off")  # index -> name, as calibration files spell them


def child_state(parent_state, rank):
    """The state a node hands its children: spine while every node so far is a top-1, sibling right after a
    rank >= 1 node, off after that. Works on ints and on integer tensors alike."""
    if isinstance(rank, Tensor):
        return torch.where(rank > 0, SIBLING, torch.where(parent_state == SPINE, SPINE, OFF))
    return SIBLING if rank > 0 else (SPINE if parent_state == SPINE else OFF)


def sibling_order(inc: Tensor) -> tuple[Tensor, Tensor]:
    """inc [bs, D, k, S] -> (sorted increments [bs, D, S, k], ranks in that order [bs, D, S, k]): the order in
    which a parent in state s meets its children (increment descending, equal increments by rank)."""
    return torch.sort(inc.permute(0, 1, 3, 2).double(), dim=-1, descending=True, stable=True)


def host_sibling_order(inc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``sibling_order`` on the host (a NumPy sort of a few hundred short rows costs a fraction of torch's):
    inc [bs, D, k, S] -> (sorted increments [bs, D, S, k], ranks in that order [bs, D, S, k])."""
    by_state = inc.transpose(0, 1, 3, 2)  # [bs, D, S, k]
    order = np.argsort(-by_state, axis=-1, kind="stable")  # descending; a stable sort keeps equal ones by rank
    return np.sort(by_state, axis=-1)[..., ::-1], order  # the values alone: equal ones are alike in any order


def rank_class(parent_class, rank):
    """The class rule of previous-token-conditioned increments: a node's children see its own rank."""
    return rank


def path_tree_heap(inc: Tensor, topi: Tensor, root_tokens: Tensor, budget: int, child_class=child_state,
                   root_class: int = SPINE) -> Tree:
    """The host build: one best-first heap walk per request (tensors on the CPU, or NumPy arrays).

    inc [bs, D, k, S]: log-probability that candidate j of slot d is the target's token given a parent of
    class s (<= 0; by default s is the path state); topi [bs, D, k]: the candidates' token ids, j = the token's
    rank in its slot; root_tokens [bs]. -> Tree of 1 + min(budget, prefixes there are) nodes, root first."""
    sv, so = host_sibling_order(np.asarray(inc))
    # Host arrays, read one entry at a time: a walk reads about 3 x budget of the D x S x k entries, so turning
    # them all into Python lists would cost more than the walk (each read is made a Python float / int, so the
    # sums stay float64 and the compares cheap).
    ids = np.asarray(topi)
    roots = np.asarray(root_tokens).reshape(-1).tolist()
    rows = [_heap_row(sv[b], so[b], ids[b], roots[b], budget, child_class, root_class) for b in range(len(roots))]
    cols = [torch.from_numpy(np.array([r[f] for r in rows], dtype=np.int64)) for f in range(4)]
    return Tree(*cols, torch.from_numpy(np.array([r[4] for r in rows], dtype=np.float64)))


def _heap_row(sv, so, ids, root_token: int, budget: int, child_class, root_class: int):
    """One request: sv/so [D, S, k] sorted increments and their ranks; ids [D, k] (numpy). Pop the best prefix,
    make it a node, push its next sibling (same parent, next position) and its first child (next slot,
    position 0). The heap key (-score, depth, parent, position) is the documented tie rule."""
    D, k = ids.shape
    tokens, parents, depth, rank, score, state = [root_token], [-1], [0], [0], [0.0], [root_class]
    heap = [(-float(sv[0, root_class, 0]), 1, 0, 0, 0.0)] if D and k else []
    while heap and len(tokens) <= budget:
        neg, d, par, pos, par_score = heapq.heappop(heap)
        s_par = state[par]
        r = int(so[d - 1, s_par, pos])
        idx = len(tokens)
        tokens.append(int(ids[d - 1, r]))
        parents.append(par)
        depth.append(d)
        rank.append(r)
        score.append(-neg)
        state.append(child_class(s_par, r))
        if pos + 1 < k:
            heapq.heappush(heap, (-(par_score + float(sv[d - 1, s_par, pos + 1])), d, par, pos + 1, par_score))
        if d < D:
            heapq.heappush(heap, (-(-neg + float(sv[d, state[idx], 0])), d + 1, idx, 0, -neg))
    return tokens, parents, depth, rank, score


def beam_sizes(D: int, k: int, budget: int) -> tuple[int, ...]:
    """Entries kept per depth: the best min(k, budget) of slot 0, then at most ``budget`` (no more than exist).
    A prefix outside the best ``budget`` of its depth has no descendant among the best ``budget`` overall."""
    sizes = [min(k, budget)]
    for _ in range(1, D):
        sizes.append(min(budget, sizes[-1] * k))
    return tuple(sizes)


def path_tree_vectorized(inc: Tensor, topi: Tensor, root_tokens: Tensor, budget: int, child_class=child_state,
                         root_class: int = SPINE) -> Tree:
    """The device build (same arguments and tree as ``path_tree_heap``): per-depth beams, no host sync."""
    bs, D, k, _ = inc.shape
    dev = inc.device
    sinc, order = sibling_order(inc)  # [bs, D, S, k]
    sizes = beam_sizes(D, k, budget)
    m = sizes[0]
    beam = sinc[:, 0, root_class, :m]  # [bs, m] every depth-1 parent is the root
    rnk = order[:, 0, root_class, :m]  # [bs, m]
    st = child_class(torch.full_like(rnk, root_class), rnk)
    scores, parent, ranks = [beam], [torch.full_like(rnk, -1)], [rnk]
    offset = 0
    for d in range(1, D):
        # Every (beam entry p, sibling position j): the row of slot d's sorted increments for p's state.
        rows = sinc[:, d].gather(1, st[:, :, None].expand(bs, st.shape[1], k))  # [bs, m, k]
        cand = (beam[:, :, None] + rows).reshape(bs, -1)  # [bs, m * k], parent-major
        pick = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, : sizes[d]]  # [bs, m_d]
        p = pick // k
        r = order[:, d].gather(1, st[:, :, None].expand(bs, st.shape[1], k)).reshape(bs, -1).gather(1, pick)
        beam = cand.gather(1, pick)
        st = child_class(st.gather(1, p), r)
        scores.append(beam)
        parent.append(p + offset)
        ranks.append(r)
        offset += sizes[d - 1]

    return tree_from_beams(root_tokens, topi, sizes, scores, parent, ranks, budget)


def path_tree(inc: Tensor, topi: Tensor, root_tokens: Tensor, budget: int, sync_free: bool = False,
              child_class=child_state, root_class: int = SPINE) -> Tree:
    """The host heap on a CPU unless ``sync_free``; the device build otherwise (both give the same tree)."""
    if sync_free or inc.device.type != "cpu":
        return path_tree_vectorized(inc, topi, root_tokens, budget, child_class, root_class)
    return path_tree_heap(inc, topi, root_tokens, budget, child_class, root_class)
