"""The conditioned tree's vectorised build equals the simple reference build (the host heap of ``path_tree`` with
rank classes) on random inputs, ties included, over the batch; it reads nothing back from the device (every shape
from D, k and the budget) and expands no parent that cannot have a child in the tree."""
from __future__ import annotations

import pytest
import torch

from ddtree_kernels import validate_tree
from ddtree_kernels.cond_tree import build_cond_tree, plan
from ddtree_kernels.path_tree import path_tree_heap, rank_class


def random_inc(bs, D, k, seed, ties=False):
    g = torch.Generator().manual_seed(seed)
    inc = -torch.rand(bs, D, k, k, generator=g, dtype=torch.float64) * 3
    if ties:  # few distinct values: equal scores everywhere
        inc = -(torch.randint(0, 3, (bs, D, k, k), generator=g).double())
    topi = torch.stack([torch.randperm(50, generator=g)[:k] for _ in range(bs * D)]).reshape(bs, D, k)
    return inc, topi


def same(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("tokens", "parents", "depth", "rank")) and \
        torch.allclose(a.score, b.score)


@pytest.mark.parametrize("seed", range(10))
def test_the_vectorised_build_is_the_reference_build(seed):
    ties = seed % 2 == 1
    for D, k, budget in ((1, 3, 2), (4, 3, 7), (5, 4, 30), (3, 2, 100), (15, 8, 8), (15, 16, 16), (15, 16, 32),
                         (6, 5, 1), (15, 4, 64)):
        inc, topi = random_inc(3, D, k, seed, ties)
        roots = torch.tensor([7, 9, 11])
        want = path_tree_heap(inc, topi, roots, budget, rank_class, 0)
        got = build_cond_tree(inc, topi, roots, budget)
        assert same(got, want), (D, k, budget, ties)
        for b in range(3):  # each row is the tree it would get alone
            assert same(build_cond_tree(inc[b : b + 1], topi[b : b + 1], roots[b : b + 1], budget), want[b])
        validate_tree(got, budget, 50, roots, D)


def broom(D: int, k: int, d: int, p: int, j: int) -> torch.Tensor:
    """inc [1, D, k, k] whose best p + j + d + 1 prefixes are: a chain of d - 1 top-1s, p + 1 candidates of slot
    d - 1 below it, and the first j + 1 children of the last of them, the (p, j) candidate of slot d last: the
    tightest case of the bound on which candidates a depth forms."""
    inc = torch.full((1, D, k, k), -100.0, dtype=torch.float64)
    inc[0, : d - 1, 0, :] = 0.0  # the chain: rank 0 under any class
    inc[0, d - 1, : p + 1, 0] = -1.0 - 0.001 * torch.arange(p + 1)  # below the chain's last (class 0)
    inc[0, d, : j + 1, p] = -0.001 * torch.arange(j + 1)  # children of the rank-p entry only
    return inc


@pytest.mark.parametrize("d,p,j", [(1, 0, 0), (1, 3, 2), (2, 0, 4), (3, 2, 2), (4, 5, 0), (5, 1, 6)])
def test_the_last_node_the_bound_allows_is_kept(d, p, j):
    D, k, budget = 7, 8, p + j + d + 1
    inc = broom(D, k, d, p, j)
    topi = torch.arange(D * k).reshape(1, D, k)
    roots = torch.tensor([99])
    want = path_tree_heap(inc, topi, roots, budget, rank_class, 0)
    got = build_cond_tree(inc, topi, roots, budget)
    assert same(got, want)
    assert got.depth[0, -1] == d + 1 and got.rank[0, -1] == j and got.tokens[0, -1] == d * k + j


def test_only_parents_that_can_have_a_child_in_the_tree_are_expanded():
    sizes, parents = plan(15, 16, 16)
    assert sizes[0] == 16 and all(m <= 16 - d for d, m in enumerate(sizes))
    assert all(p <= 16 - d for d, p in enumerate(parents) if d) and len(sizes) <= 15
    assert plan(15, 16, 1) == ((1,), (1,))  # one node: slot 0's best


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_build_never_waits_for_the_device():
    inc, topi = random_inc(8, 15, 16, 0)
    inc, topi, roots = inc.cuda(), topi.cuda(), torch.arange(8).cuda()
    build_cond_tree(inc, topi, roots, 16)  # tables cached
    torch.cuda.set_sync_debug_mode("error")
    try:
        build_cond_tree(inc, topi, roots, 16)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("budget", [8, 16, 32])
def test_with_its_head_the_build_dispatches_fewer_kernels_than_ddtrees(budget):
    """Under CUDA graphs a build this small costs about a launch per kernel: CondTree's (the head's increments and
    the vectorised build) dispatches fewer than DDTree's vectorised build from its top-k, at every batch size."""
    from ddtree_kernels.tree_build import build_tree_vectorized, sorted_slots
    from workbench.bench.kernel_bench import kernels, random_head
    from workbench.engine.policies.cond_head import conditioned_increments

    head = random_head(64, 32, 0)
    for bs in (1, 8):
        g = torch.Generator().manual_seed(budget + bs)
        lp = torch.log_softmax(torch.randn(bs, 15, 64, generator=g), -1)
        hidden, roots = torch.randn(bs, 15, 32, generator=g), torch.arange(bs)
        topv, topi = sorted_slots(lp, head.K)
        k = min(budget, head.K)
        dv, di = sorted_slots(lp, budget)
        cond = kernels(lambda: build_cond_tree(conditioned_increments(head, hidden, topv, topi, roots, k),
                                               topi[..., :k], roots, budget))
        ddtree = kernels(lambda: build_tree_vectorized(dv, di, roots, budget))
        assert cond < ddtree, (bs, cond, ddtree)
