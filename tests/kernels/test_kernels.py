"""Parity of the tree kernels against their independent oracles, on random inputs."""
from __future__ import annotations

import pytest
import torch

from ddtree_kernels import accept, build_tree, chain_tree, compact_kv, compact_kv_, compile_tree
from ddtree_kernels.tree_build import build_tree_from_topk, build_tree_vectorized, sorted_slots
from ddtree_kernels.oracles import (accept_walk_python, ancestors_python, build_tree_greedy_exact, build_tree_heap,
                                   build_tree_host_heap,
                                   compact_kv_loop)


def random_logprobs(seed: int, bs: int, D: int, V: int, ties: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, D, V, generator=g) * 3
    if ties:  # coarse values make many exactly equal log-probs: exercises the tie rule
        logits = (logits * 2).round() / 2
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [1, 2, 7, 32, 100])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("ops", ["host", "torch"])
def test_vectorized_build_equals_heap_oracle(seed, budget, ties, ops):
    """Both builds (the host heap CPU tensors take, the vectorized one CUDA takes) against the oracle."""
    D, V, bs = 5, 12, 3
    lp = random_logprobs(seed, bs, D, V, ties)
    roots = torch.arange(bs)
    k = min(budget, V)
    build = build_tree_vectorized if ops == "torch" else build_tree_from_topk
    tree = build(*sorted_slots(lp, k), roots, budget)
    for b in range(bs):
        ref = build_tree_heap(lp[b], int(roots[b]), budget)
        assert tree.tokens[b].tolist() == ref["tokens"]
        assert tree.parents[b].tolist() == ref["parents"]
        assert tree.depth[b].tolist() == ref["depth"]
        assert tree.rank[b].tolist() == ref["rank"]
        assert tree.score[b].tolist() == pytest.approx(ref["score"], abs=0)


@pytest.mark.parametrize("width", [1, 2, 3])
def test_width_limits_children_and_width_one_is_the_argmax_chain(width):
    lp = random_logprobs(1, 2, 6, 20)
    tree = build_tree(lp, torch.tensor([3, 4]), budget=50, width=width)
    for b in range(2):
        ref = build_tree_heap(lp[b], 0, 50, width=width)
        assert tree.parents[b].tolist() == ref["parents"]
        assert int(tree.rank[b].max()) < width
    chain = build_tree(lp, torch.tensor([3, 4]), budget=6, width=1)
    expect = chain_tree(lp.argmax(-1), torch.tensor([3, 4]), lp)
    for field in ("tokens", "parents", "depth", "rank"):
        assert torch.equal(getattr(chain, field), getattr(expect, field)), field
    assert torch.allclose(chain.score, expect.score)


def test_tree_is_prefix_closed_sorted_and_siblings_distinct():
    lp = random_logprobs(7, 4, 8, 50)
    tree = build_tree(lp, torch.zeros(4, dtype=torch.long), budget=64)
    assert tree.n == 65
    for b in range(4):
        par = tree.parents[b].tolist()
        assert all(par[i] < i for i in range(1, len(par)))
        assert torch.all(tree.score[b, 1:-1] >= tree.score[b, 2:])  # best-first order
        seen = set()
        for i in range(1, len(par)):
            key = (par[i], int(tree.tokens[b, i]))
            assert key not in seen
            seen.add(key)
            assert tree.depth[b, i] == tree.depth[b, par[i]] + 1


def test_budget_larger_than_all_prefixes_keeps_them_all():
    lp = random_logprobs(0, 1, 2, 3)
    tree = build_tree(lp, torch.tensor([0]), budget=100)
    assert tree.n == 1 + 3 + 9


@pytest.mark.parametrize("seed", range(5))
def test_compile_matches_python_ancestry_and_retrieve_arrays(seed):
    lp = random_logprobs(seed, 2, 6, 10)
    tree = build_tree(lp, torch.tensor([1, 2]), budget=40)
    ct = compile_tree(tree, start=torch.tensor([5, 9]), max_depth=6)
    for b in range(2):
        par = tree.parents[b].tolist()
        anc = ancestors_python(par)
        n = len(par)
        for i in range(n):
            assert {j for j in range(n) if ct.visibility[b, i, j]} == anc[i]
        assert ct.positions[b].tolist() == [(5, 9)[b] + d for d in tree.depth[b].tolist()]
        assert ct.retrieve_index[b].tolist() == [b * n + i for i in range(n)]
        for i in range(n):
            kids = [j for j in range(n) if par[j] == i]
            assert ct.retrieve_next_token[b, i] == (kids[0] if kids else -1)
            if i:
                sibs = [j for j in range(n) if par[j] == par[i] and j > i]
                assert ct.retrieve_next_sibling[b, i] == (sibs[0] if sibs else -1)


def random_choice_along_tree(tree, seed, p_follow=0.7):
    """Target choices that follow some child with probability p_follow, else a random token."""
    g = torch.Generator().manual_seed(seed)
    bs, n = tree.tokens.shape
    choice = torch.randint(0, 50, (bs, n), generator=g)
    for b in range(bs):
        for i in range(n):
            kids = [j for j in range(n) if int(tree.parents[b, j]) == i]
            if kids and torch.rand(1, generator=g).item() < p_follow:
                choice[b, i] = tree.tokens[b, kids[int(torch.randint(len(kids), (1,), generator=g))]]
    return choice


@pytest.mark.parametrize("backend", ["torch", "sglang", "sglang-triton"])
@pytest.mark.parametrize("seed", range(8))
def test_accept_backends_equal_python_walk(backend, seed):
    if backend != "torch":
        pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    D = 6
    lp = random_logprobs(seed, 3, D, 50)
    tree = build_tree(lp, torch.tensor([1, 2, 3]), budget=30)
    ct = compile_tree(tree, start=0, max_depth=D)
    choice = random_choice_along_tree(tree, seed)
    got = accept(backend, tree, ct, choice, D)
    for b in range(3):
        path, bonus = accept_walk_python(tree.tokens[b].tolist(), tree.parents[b].tolist(), choice[b].tolist())
        assert got.index[b, : len(path)].tolist() == path
        assert torch.all(got.index[b, len(path):] == -1)
        assert int(got.length[b]) == len(path) - 1
        assert int(got.bonus[b]) == bonus


def test_sglang_kernel_is_really_run():
    """The wrapper that silently does nothing on CPU must not be what we call."""
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    from ddtree_kernels.sglang_backend import verify_tree_greedy

    tree = chain_tree(torch.tensor([[5, 6, 7]]), torch.tensor([4]))
    ct = compile_tree(tree, 0, 3)
    choice = torch.tensor([[5, 6, 9, 9]])
    index, num, predicts = verify_tree_greedy(tree.tokens, ct.retrieve_index, ct.retrieve_next_token,
                                              ct.retrieve_next_sibling, choice, 3)
    assert num.tolist() == [2]
    assert index.tolist() == [[0, 1, 2, -1]]
    assert int(predicts[2]) == 9


@pytest.mark.parametrize("seed", range(4))
def test_compact_kv_equals_loop(seed):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(1, 2, 7 + 9, 4, generator=g)
    accepted = torch.tensor([0, 3, 5, 8])
    assert torch.equal(compact_kv(kv, 7, accepted), compact_kv_loop(kv, 7, accepted.tolist()))


@pytest.mark.parametrize("seed", range(4))
def test_in_place_compaction_equals_the_loop_oracle(seed):
    g = torch.Generator().manual_seed(seed)
    start, n = 5, 9
    buf = torch.randn(2, 3, start + n + 4, 4, generator=g)  # spare rows past the tree, as a cache buffer has
    nodes = torch.tensor(sorted(set(torch.randint(1, n, (4,), generator=g).tolist())))
    nodes = torch.cat([torch.tensor([0]), nodes])
    expect = compact_kv_loop(buf[:, :, : start + n], start, nodes.tolist())
    got = compact_kv_(buf.clone(), start, nodes)[:, :, : start + len(nodes)]
    assert torch.equal(got, expect)


@pytest.mark.parametrize("budget", [16, 64, 256])
def test_host_heap_baseline_equals_the_vectorized_build(budget):
    """The speed baseline decodes the same trees (random log-probs have no ties)."""
    lp = random_logprobs(budget, 2, 15, 300)
    roots = torch.tensor([1, 2])
    a, b = build_tree(lp, roots, budget), build_tree_host_heap(lp, roots, budget)
    for f in ("tokens", "parents", "depth", "rank", "score"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def tie_heavy_logprobs(seed: int, bs: int, D: int, V: int) -> torch.Tensor:
    """Log-probs the way a bf16 drafter gives them: few distinct values, so many exact ties, a few
    -inf (masked tokens), and pairs one float32 ulp apart whose path sums round together in float32."""
    g = torch.Generator().manual_seed(seed)
    base = torch.tensor([0.0, -0.5, -1.0, -2.0, -3.0, -8.0], dtype=torch.float32)
    # (no neighbour of 0: a denormal beside -8 is the one kind of sum float64 cannot hold exactly)
    pool = torch.cat([base, torch.nextafter(base[1:], torch.tensor(-1e9)), torch.tensor([float("-inf")])])
    return pool[torch.randint(0, len(pool), (bs, D, V), generator=g)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("budget", [3, 9, 40])
def test_tie_order_equals_the_exact_greedy_oracle(seed, budget):
    """Both builds against the rule written out with exact sums (no heap, no float): ties, -inf, and
    near-ulp differences that a float32 sum collapses into false ties must all come out in one order."""
    D, V, bs = 4, 6, 4
    lp = tie_heavy_logprobs(seed, bs, D, V)
    roots = torch.arange(bs)
    k = min(budget, V)
    for build in (build_tree_vectorized, build_tree_from_topk):
        tree = build(*sorted_slots(lp, k), roots, budget)
        assert tree.score.dtype == torch.float64
        for b in range(bs):
            ref = build_tree_greedy_exact(lp[b], int(roots[b]), budget)
            got = {f: getattr(tree, f)[b].tolist() for f in ("tokens", "parents", "depth", "rank", "score")}
            assert got == ref, (build.__name__, b)
    assert tree_of(build_tree(lp, roots, budget)) == tree_of(tree)  # the public entry takes the same route


def tree_of(t) -> list:
    return [getattr(t, f).tolist() for f in ("tokens", "parents", "depth", "rank")]


def test_float32_sums_would_reorder_this_case():
    """Exact scores: A = (0, 0) at -4 - 3u (u = 2**-23) beats B = (1,) at -4 - 4u. In float32 A's sum
    rounds to -4 - 4u, a false tie that the depth rule hands to B. float64 keeps A first."""
    u = 2.0 ** -23
    lp = torch.full((1, 2, 3), float("-inf"))
    lp[0, 0, 0], lp[0, 0, 1] = -1 - 3 * u, -4 - 4 * u  # both exact in float32
    lp[0, 1, 0] = -3.0
    for build in (build_tree_vectorized, build_tree_from_topk):
        tree = build(*sorted_slots(lp, 3), torch.tensor([7]), 2)
        assert tree.depth[0].tolist() == [0, 1, 2], build.__name__  # root, (0,), then A
        assert tree.score[0, 2].item() == -4 - 3 * u


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_choice_equals_argmax_with_and_without_ties(dtype):
    """The CPU shortcut (top-2's first when no node ties) against the oracle, argmax, on random logits:
    no ties, two- and many-way ties for the max (bf16 makes them routine), -inf and all-equal rows."""
    from ddtree_kernels.greedy import greedy_choice

    g = torch.Generator().manual_seed(3)
    shortcuts = 0
    for trial in range(200):
        n, V = int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(2, 300, (1,), generator=g))
        logits = (torch.randn(2, n, V, generator=g) * 3).to(dtype)
        kind = trial % 5
        if kind == 1:  # a two-way tie for the max at one node, the later index first in memory order
            b, i = 0, n // 2
            j, k = sorted(torch.randperm(V, generator=g)[:2].tolist())
            logits[b, i, k] = logits[b, i, j] = logits[b, i].max() + 1
        elif kind == 2:  # many-way ties everywhere: a coarse grid of values
            logits = torch.randint(0, 3, (2, n, V), generator=g).to(dtype)
        elif kind == 3:
            logits[:, 0] = float("-inf")
            logits[:, 0, V - 1] = 0.0
        elif kind == 4:
            logits[1] = 1.5
        for sync_free in (False, True):
            choice, top_v, top_i = greedy_choice(logits, sync_free)
            assert torch.equal(choice, logits.argmax(-1)), (trial, sync_free)
            assert torch.equal(top_v, logits.topk(2, dim=-1).values)
        ties = bool((logits.topk(2, dim=-1).values.diff(dim=-1) == 0).any())
        shortcuts += not ties
    assert 10 < shortcuts < 200  # both routes were taken


@pytest.mark.parametrize("k", [16, 63, 64, 65, 100])
def test_host_top_slots_equal_the_keyed_order_with_ties_inside_and_at_the_kth_place(k):
    """The CPU's top-k shortcut (either side of the 64 where torch's top-k changes algorithm) gives exactly
    ``sorted_slots``' order: on distinct log-probs, with a tie inside the top k, and with a token outside the
    top k equal to the k-th."""
    from ddtree_kernels.tree_build import top_slots

    g = torch.Generator().manual_seed(k)
    lp = torch.log_softmax(torch.randn(2, 3, 300, generator=g) * 3, dim=-1)
    cases = [lp]
    inside = lp.clone()
    v, i = torch.topk(inside, k, dim=-1)
    inside[0, 1, i[0, 1, 3]] = v[0, 1, 2]  # the 3rd and 4th best equal
    cases.append(inside)
    boundary = lp.clone()
    v, i = torch.topk(boundary, k + 1, dim=-1)
    boundary[1, 2, i[1, 2, k]] = v[1, 2, k - 1]  # the (k+1)-th equal to the k-th: which one is kept is the rule's
    cases.append(boundary)
    for case in cases:
        got, want = top_slots(case, k), sorted_slots(case, k)
        assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
