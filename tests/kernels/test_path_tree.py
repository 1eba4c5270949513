"""The path-conditioned tree build: host heap and device build give one tree, it is the documented rule's
(an exhaustive oracle on small inputs), and with state-blind increments it is DDTree's tree."""
from __future__ import annotations

import itertools

import pytest
import torch

from ddtree_kernels import build_tree_from_topk, validate_tree
from ddtree_kernels.path_tree import (OFF, SIBLING, SPINE, child_state, path_tree_heap, path_tree_vectorized,
                                      rank_class)
from ddtree_kernels.tree_build import sorted_slots


def random_inc(bs, D, k, seed, ties=False, classes=3):
    g = torch.Generator().manual_seed(seed)
    inc = -torch.rand(bs, D, k, classes, generator=g, dtype=torch.float64) * 3
    if ties:  # few distinct values: equal scores everywhere
        inc = -(torch.randint(0, 3, (bs, D, k, classes), generator=g).double())
    topi = torch.stack([torch.randperm(50, generator=g)[:k] for _ in range(bs * D)]).reshape(bs, D, k)
    return inc, topi


def same(a, b):
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("tokens", "parents", "depth", "rank")) and \
        torch.allclose(a.score, b.score)


@pytest.mark.parametrize("seed", range(12))
def test_heap_and_device_build_agree(seed):
    ties = seed % 2 == 1
    for D, k, budget in ((1, 3, 2), (4, 3, 7), (5, 4, 30), (3, 2, 100)):
        inc, topi = random_inc(2, D, k, seed, ties)
        roots = torch.tensor([7, 9])
        a = path_tree_heap(inc, topi, roots, budget)
        b = path_tree_vectorized(inc, topi, roots, budget)
        assert same(a, b), (D, k, budget, ties)
        validate_tree(a, budget, 50, roots, D)


def oracle(inc, topi, root, budget, rule=child_state):
    """Every prefix of ranks scored by its path's increments; the best ``budget`` by the documented rule,
    taken one at a time from the candidates whose parent is in (a plain scan, no heap, no beams)."""
    D, k = topi.shape[0], topi.shape[1]
    nodes = [((), 0.0, SPINE)]  # (rank path, score, state handed to children)
    while len(nodes) <= budget:
        best = None
        for pi, (path, sc, st) in enumerate(nodes):
            d = len(path)
            if d == D:
                continue
            order = sorted(range(k), key=lambda j: (-float(inc[d, j, st]), j))
            for pos, j in enumerate(order):
                if any(n[0] == path + (j,) for n in nodes):
                    continue
                key = (-(sc + float(inc[d, j, st])), d + 1, pi, pos)
                if best is None or key < best[0]:
                    best = (key, path + (j,), sc + float(inc[d, j, st]), rule(st, j))
        if best is None:
            break
        nodes.append(best[1:])
    return [int(topi[len(p) - 1, p[-1]]) if p else root for p, _, _ in nodes]


@pytest.mark.parametrize("seed", range(6))
def test_the_build_is_the_documented_rule(seed):
    inc, topi = random_inc(1, 4, 3, 100 + seed, ties=seed % 2 == 0)
    for budget in (1, 5, 12, 40):
        t = path_tree_heap(inc, topi, torch.tensor([3]), budget)
        assert t.tokens[0].tolist() == oracle(inc[0], topi[0], 3, budget)


def test_state_blind_increments_give_ddtree():
    g = torch.Generator().manual_seed(0)
    lp = torch.log_softmax(torch.randn(2, 6, 40, generator=g), -1)
    v, i = sorted_slots(lp, 8)
    inc = v.double()[..., None].expand(2, 6, 8, 3)
    roots = torch.tensor([1, 2])
    a, b = path_tree_heap(inc, i, roots, 20), build_tree_from_topk(v, i, roots, 20)
    assert same(a, b)


def test_child_states():
    assert [child_state(SPINE, 0), child_state(SPINE, 2), child_state(SIBLING, 0), child_state(OFF, 0),
            child_state(OFF, 1)] == [SPINE, SIBLING, OFF, OFF, SIBLING]
    t = child_state(torch.tensor([SPINE, SPINE, SIBLING, OFF]), torch.tensor([0, 1, 0, 0]))
    assert t.tolist() == [SPINE, SIBLING, OFF, OFF]


@pytest.mark.parametrize("seed", range(8))
def test_rank_classes_condition_on_the_parents_token(seed):
    """Increments per parent rank (a previous-token-conditioned score): both builds and the oracle agree."""
    for D, k, budget in ((4, 3, 9), (5, 4, 30)):
        inc, topi = random_inc(2, D, k, 200 + seed, seed % 2 == 1, classes=k)
        roots = torch.tensor([4, 6])
        a = path_tree_heap(inc, topi, roots, budget, rank_class, 0)
        b = path_tree_vectorized(inc, topi, roots, budget, rank_class, 0)
        assert same(a, b)
        assert a.tokens[0].tolist() == oracle(inc[0], topi[0], 4, budget, rank_class)
