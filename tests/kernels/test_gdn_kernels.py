"""GatedDeltaNet tree verify: the torch oracle against SGLang's Triton kernels (interpreter on CPU) and against
the level-batched torch path on random trees, and the oracle on a chain against transformers' own conv and
delta-rule functions."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from ddtree_kernels import Tree, build_tree, chain_tree, compile_tree
from ddtree_kernels.dispatch import gdn_tree_conv, gdn_tree_delta_rule, gdn_tree_delta_rule_gated
from ddtree_kernels.gdn_tree import (commit_nodes, gdn_gates, parents_from_links, tree_causal_conv1d,
                                    tree_gated_delta_rule)
from ddtree_kernels.gdn_tree_fast import tree_causal_conv1d_levels, tree_gated_delta_rule_levels, tree_levels
from shared_checks import random_tree

needs_sglang = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("triton") is None,
    reason="sglang / triton not installed (make install-sglang)")


def trees():
    """(name, tree): random shapes, a budget tree from the build, a chain, single-node trees."""
    lp = torch.log_softmax(torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(3)) * 2, -1)
    yield "random-bs2-n6", random_tree(0, 2, 6)
    yield "random-bs3-n9", random_tree(1, 3, 9)
    yield "build-bs3-n8", build_tree(lp, torch.tensor([1, 2, 3]), budget=7)
    yield "chain-bs2-n5", chain_tree(torch.randint(0, 9, (2, 4)), torch.tensor([4, 5]))
    yield "single-bs2-n1", chain_tree(torch.zeros(2, 0, dtype=torch.long), torch.tensor([4, 5]))


TREES = dict(trees())


def conv_inputs(seed: int, tree: Tree, dim: int, K: int, ties: bool):
    g = torch.Generator().manual_seed(seed)
    bs, n = tree.parents.shape
    x = torch.randn(bs, n, dim, generator=g)
    if ties:  # identical sibling tokens: every node takes its first sibling's input
        x = tie_siblings(x, tree)
    return (x, torch.randn(bs, dim, K - 1, generator=g), torch.randn(dim, K, generator=g) / K,
            torch.randn(dim, generator=g))


def tie_siblings(x: torch.Tensor, tree: Tree) -> torch.Tensor:
    """Each node's row replaced by its lowest-index sibling's (same parent): what identical tokens give."""
    x = x.clone()
    for b in range(x.shape[0]):
        first = {}
        for i, p in enumerate(tree.parents[b].tolist()):
            first.setdefault(p, i)
            x[b, i] = x[b, first[p]]
    return x


def delta_inputs(seed: int, tree: Tree, H: int, HV: int, Dk: int, Dv: int, ties: bool):
    g = torch.Generator().manual_seed(seed)
    bs, n = tree.parents.shape
    q, k = torch.randn(bs, n, H, Dk, generator=g), torch.randn(bs, n, H, Dk, generator=g)
    v = torch.randn(bs, n, HV, Dv, generator=g)
    a, b = torch.randn(bs, n, HV, generator=g), torch.randn(bs, n, HV, generator=g)
    if ties:
        q, k, v, a, b = (tie_siblings(t, tree) for t in (q, k, v, a, b))
    gate, beta = gdn_gates(torch.randn(HV, generator=g), torch.randn(HV, generator=g), a, b)
    return q, k, v, gate, beta, torch.randn(bs, HV, Dk, Dv, generator=g)


def test_parents_from_links_equal_tree_parents():
    for name, tree in TREES.items():
        c = compile_tree(tree, 0)
        assert torch.equal(parents_from_links(c.retrieve_next_token, c.retrieve_next_sibling), tree.parents), name
    # SGLang's documented example: next_token [1, 3, -1, -1], next_sibling [-1, 2, -1, -1] -> parents [., 0, 0, 1]
    got = parents_from_links(torch.tensor([[1, 3, -1, -1]]), torch.tensor([[-1, 2, -1, -1]]))
    assert got.tolist() == [[-1, 0, 0, 1]]


def test_oracle_rejects_bad_parents_and_shapes():
    x, win, w, b = conv_inputs(0, TREES["chain-bs2-n5"], 6, 4, False)
    bad = TREES["chain-bs2-n5"].parents.clone()
    bad[0, 2] = 3  # a parent after its child
    with pytest.raises(ValueError, match="precede"):
        tree_causal_conv1d(x, win, w, b, "silu", bad)
    with pytest.raises(ValueError, match=r"conv_window \[bs, dim, K-1\]"):
        tree_causal_conv1d(x, win[..., :2], w, b, "silu", TREES["chain-bs2-n5"].parents)


def test_unknown_backend_is_named():
    tree = TREES["chain-bs2-n5"]
    x, win, w, b = conv_inputs(0, tree, 6, 4, False)
    with pytest.raises(ValueError, match="kernel_backend='cuda-magic'"):
        gdn_tree_conv("cuda-magic", x, win, w, b, "silu", tree.parents, tree.parents, tree.parents)
    q, k, v, g, beta, state = delta_inputs(0, tree, 1, 1, 4, 4, False)
    with pytest.raises(ValueError, match="kernel_backend='cuda-magic'"):
        gdn_tree_delta_rule("cuda-magic", q, k, v, g, beta, state, tree.parents)


def test_oracle_siblings_continue_from_the_parent_not_the_previous_node():
    """The rule itself, by hand on the tree 0 -> {1, 2}: node 2's output equals node 1's when their inputs are
    equal, and equals a chain 0 -> 2's last output; a flattened recurrence would give node 2 another state."""
    parents = torch.tensor([[-1, 0, 0]])
    q, k, v, g, beta, state = delta_inputs(5, Tree(*(torch.zeros(1, 3, dtype=torch.long),) * 5), 1, 2, 4, 4, False)
    for t in (q, k, v, g, beta):
        t[:, 2] = t[:, 1]
    out, states = tree_gated_delta_rule(q, k, v, g, beta, state, parents)
    assert torch.equal(out[:, 1], out[:, 2]) and torch.equal(states[:, 1], states[:, 2])
    flat, _ = tree_gated_delta_rule(q, k, v, g, beta, state, torch.tensor([[-1, 0, 1]]))
    assert (flat[:, 2] - out[:, 2]).abs().max() > 1e-3


def test_commit_then_continue_equals_the_accepted_path_as_a_chain():
    """Verify a tree, keep the last accepted node's window and state, verify the next token from them: the same
    outputs as running root ... accepted node ... next token as one chain from the start."""
    tree = TREES["random-bs3-n9"]
    bs, n = tree.parents.shape
    last = torch.tensor([8, 0, 5])  # one deep node, the root alone, another branch
    x, win, w, b = conv_inputs(0, tree, 6, 4, False)
    q, k, v, g, beta, state = delta_inputs(1, tree, 1, 2, 4, 4, False)
    _, windows = tree_causal_conv1d(x, win, w, b, "silu", tree.parents)
    _, states = tree_gated_delta_rule(q, k, v, g, beta, state, tree.parents)
    win2, state2 = commit_nodes(windows, states, last)
    nxt = [torch.randn(bs, 1, *t.shape[2:]) for t in (x, q, k, v)]
    ng, nb = -torch.rand(bs, 1, 2), torch.rand(bs, 1, 2)
    root = torch.full((bs, 1), -1)
    out_c, _ = tree_causal_conv1d(nxt[0], win2, w, b, "silu", root)
    out_d, _ = tree_gated_delta_rule(nxt[1], nxt[2], nxt[3], ng, nb, state2, root)
    for r in range(bs):
        path = [int(last[r])]
        while path[-1] > 0:
            path.append(int(tree.parents[r, path[-1]]))
        path = path[::-1]
        chain = torch.arange(len(path) + 1)[None] - 1
        cat = lambda t, u: torch.cat([t[r : r + 1, path], u[r : r + 1]], 1)  # noqa: E731
        ref_c, _ = tree_causal_conv1d(cat(x, nxt[0]), win[r : r + 1], w, b, "silu", chain)
        ref_d, _ = tree_gated_delta_rule(cat(q, nxt[1]), cat(k, nxt[2]), cat(v, nxt[3]), cat(g, ng), cat(beta, nb),
                                         state[r : r + 1], chain)
        assert torch.allclose(out_c[r], ref_c[0, -1:], atol=1e-6)
        assert torch.allclose(out_d[r], ref_d[0, -1:], atol=1e-6)


@pytest.mark.parametrize("K", [4, 3, 2])
@pytest.mark.parametrize("ties", [False, True])
def test_oracle_conv_chain_equals_transformers(K, ties):
    """A chain through the oracle == transformers' cached-prefill conv (conv_states has K columns) and its
    one-token decode update, outputs and final window."""
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_fn, causal_conv1d_update

    tree = chain_tree(torch.randint(0, 9, (2, 5)), torch.tensor([1, 2]))
    x, _, w, b = conv_inputs(K, tree, 10, K, ties)
    hf_state = torch.randn(2, 10, K)  # transformers keeps K columns; the oldest is never read
    out, windows = tree_causal_conv1d(x, hf_state[..., 1:], w, b, "silu", tree.parents)
    full = torch.cat([hf_state, x.transpose(1, 2)], dim=-1)
    ref = causal_conv1d_fn(full, w, b, activation="silu")[..., -x.shape[1]:]
    assert torch.allclose(out, ref.transpose(1, 2), atol=1e-6)
    assert torch.equal(windows[:, -1], full[..., -(K - 1):])
    state = hf_state.clone()
    steps = [causal_conv1d_update(x[:, i, :, None], state, w, b, "silu")[..., 0] for i in range(x.shape[1])]
    assert torch.allclose(out, torch.stack(steps, 1), atol=1e-6)
    assert torch.equal(windows[:, -1], state[..., 1:])


@pytest.mark.parametrize("shape", [(1, 1, 4, 4), (1, 2, 4, 8), (2, 4, 8, 4)])
def test_oracle_delta_rule_chain_equals_transformers(shape):
    """A chain through the oracle == transformers' recurrent and chunked delta rules (l2norm in kernel):
    every output, and the state after every prefix."""
    from transformers.models.qwen3_next.modeling_qwen3_next import (torch_chunk_gated_delta_rule,
                                                                    torch_recurrent_gated_delta_rule)

    H, HV, Dk, Dv = shape
    n = 6
    tree = chain_tree(torch.randint(0, 9, (2, n - 1)), torch.tensor([1, 2]))
    q, k, v, g, beta, state = delta_inputs(sum(shape), tree, H, HV, Dk, Dv, False)
    out, states = tree_gated_delta_rule(q, k, v, g, beta, state, tree.parents)
    rq, rk = (t.repeat_interleave(HV // H, dim=2) for t in (q, k))  # what the HF layer does before the call
    for fn in (torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule):
        ref, final = fn(rq, rk, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
        assert torch.allclose(out, ref, atol=1e-5), fn.__name__
        assert torch.allclose(states[:, -1], final, atol=1e-5), fn.__name__
    for t in range(1, n):
        _, mid = torch_recurrent_gated_delta_rule(rq[:, :t], rk[:, :t], v[:, :t], g=g[:, :t], beta=beta[:, :t],
                                                  initial_state=state, output_final_state=True,
                                                  use_qk_l2norm_in_kernel=True)
        assert torch.allclose(states[:, t - 1], mid, atol=1e-5)


@needs_sglang
@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("K,ties", [(4, False), (4, True), (3, False), (2, True)])
def test_sglang_conv_equals_oracle(name, K, ties):
    """SGLang's causal_conv1d_update in tree mode == the oracle: outputs, every node's conv window, and the
    parent links it derives."""
    from ddtree_kernels.sglang_gdn import tree_causal_conv1d as sglang_conv

    tree = TREES[name]
    c = compile_tree(tree, 0)
    x, win, w, b = conv_inputs(K, tree, 12, K, ties)
    ref_out, ref_win = tree_causal_conv1d(x, win, w, b, "silu", tree.parents)
    out, windows, parent = sglang_conv(x, win, w, b, "silu", c.retrieve_next_token, c.retrieve_next_sibling)
    assert (out - ref_out).abs().max() < 1e-5
    assert torch.equal(windows, ref_win)  # the window holds inputs, copied, never computed
    assert torch.equal(parent[:, 1:], tree.parents[:, 1:])
    dispatched, _ = gdn_tree_conv("sglang-triton", x, win, w, b, "silu", tree.parents, c.retrieve_next_token,
                                  c.retrieve_next_sibling)
    assert torch.equal(dispatched, out)


@needs_sglang
@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("shape,ties", [((1, 2, 4, 8), False), ((1, 2, 4, 8), True), ((2, 4, 8, 4), False),
                                        ((1, 1, 6, 4), False)])
def test_sglang_delta_rule_equals_oracle(name, shape, ties):
    """SGLang's fused_recurrent_gated_delta_rule_update_fwd with retrieve_parent_token == the oracle: outputs and
    every node's state (SGLang's [HV, Dv, Dk] buffer read back as [HV, Dk, Dv])."""
    tree = TREES[name]
    q, k, v, g, beta, state = delta_inputs(sum(shape), tree, *shape, ties)
    ref_out, ref_states = tree_gated_delta_rule(q, k, v, g, beta, state, tree.parents)
    out, states = gdn_tree_delta_rule("sglang-triton", q, k, v, g, beta, state, tree.parents)
    assert (out - ref_out).abs().max() < 1e-5
    assert (states - ref_states).abs().max() < 1e-5
    if ties:  # identical siblings read identical parent states: identical results in both
        for b in range(tree.parents.shape[0]):
            for i in range(1, tree.n):
                j = tree.parents[b].tolist().index(int(tree.parents[b, i]))
                assert torch.equal(out[b, i], out[b, j])


@needs_sglang
@pytest.mark.parametrize("name", ["random-bs3-n9", "build-bs3-n8", "single-bs2-n1"])
@pytest.mark.parametrize("shape", [(1, 2, 4, 8), (2, 4, 8, 4)])
def test_sglang_fused_gating_delta_rule_equals_oracle(name, shape):
    """SGLang's fused_sigmoid_gating_delta_rule_update (gates inside the kernel, what its GDN backend runs in
    TARGET_VERIFY) == gdn_gates + the oracle, softplus past its threshold of 20 included."""
    tree = TREES[name]
    H, HV, Dk, Dv = shape
    g = torch.Generator().manual_seed(sum(shape))
    bs, n = tree.parents.shape
    q, k = torch.randn(bs, n, H, Dk, generator=g), torch.randn(bs, n, H, Dk, generator=g)
    v = torch.randn(bs, n, HV, Dv, generator=g)
    a, b = torch.randn(bs, n, HV, generator=g) * 3, torch.randn(bs, n, HV, generator=g) * 3
    a[0, 0, 0] = 25.0  # softplus(x) = x above 20, in torch and in the kernel
    A_log, dt_bias, state = torch.randn(HV, generator=g), torch.randn(HV, generator=g), torch.randn(bs, HV, Dk, Dv)
    ref = gdn_tree_delta_rule_gated("torch-oracle", q, k, v, A_log, dt_bias, a, b, state, tree.parents)
    got = gdn_tree_delta_rule_gated("sglang-triton", q, k, v, A_log, dt_bias, a, b, state, tree.parents)
    assert (got[0] - ref[0]).abs().max() < 1e-5
    assert (got[1] - ref[1]).abs().max() < 1e-5


# ------------------------------------------------------------------ the level-batched torch path == the oracle
def padded_tree(seed: int) -> Tree:
    """bs 3 padded to 10 nodes as a verify sees a batch (``HybridGDN.verify``): row 1 has 4 real nodes, row 2
    only its root; their padding nodes hang off the root."""
    tree = random_tree(seed, 3, 10)
    parents, depth = tree.parents.clone(), tree.depth.clone()
    for row, real in ((1, 4), (2, 1)):
        parents[row, real:], depth[row, real:] = 0, 1
    return Tree(tree.tokens, parents, depth, tree.rank, tree.score)


def branching_tree(bs: int, n: int) -> Tree:
    """Binary heap shape (node i's parent (i - 1) // 2): every level branches, depth log2(n)."""
    parents = ((torch.arange(n) - 1) // 2).expand(bs, n).clone()
    parents[:, 0] = -1
    depth = (torch.arange(n) + 1).float().log2().floor().long().expand(bs, n).clone()
    zeros = torch.zeros(bs, n, dtype=torch.long)
    return Tree(zeros, parents, depth, zeros, zeros.float())


FAST_TREES = {**TREES, "random-bs2-n33": random_tree(7, 2, 33), "padded-bs3-n10": padded_tree(4),
              "branching-bs2-n15": branching_tree(2, 15),
              "single-bs1-n1": chain_tree(torch.zeros(1, 0, dtype=torch.long), torch.tensor([4]))}


@pytest.mark.parametrize("name", list(FAST_TREES))
def test_tree_levels_group_every_node_by_its_depth(name):
    tree = FAST_TREES[name]
    bs, n = tree.parents.shape
    levels = tree_levels(tree.parents)
    assert len(levels) == int(tree.depth.max()) + 1
    flat_depth = tree.depth.reshape(-1)
    assert torch.equal(torch.cat(levels).sort().values, torch.arange(bs * n))  # each node exactly once
    for d, rows in enumerate(levels):
        assert bool((flat_depth[rows] == d).all()), (name, d)


@pytest.mark.parametrize("name", list(FAST_TREES))
@pytest.mark.parametrize("K,ties", [(4, False), (4, True), (3, False), (2, True), (1, False)])
def test_level_conv_equals_oracle(name, K, ties):
    """The one-shot conv (ancestor hops + committed window) == the per-node oracle: outputs and every window,
    with silu and without; the "torch" backend runs it, "torch-oracle" the oracle."""
    tree = FAST_TREES[name]
    x, win, w, b = conv_inputs(K + 10, tree, 12, K, ties)
    for act, bias in (("silu", b), (None, None)):
        ref_out, ref_win = tree_causal_conv1d(x, win, w, bias, act, tree.parents)
        out, windows = tree_causal_conv1d_levels(x, win, w, bias, act, tree.parents)
        assert (out - ref_out).abs().max() < 1e-6, (name, act)
        assert torch.equal(windows, ref_win)  # windows hold inputs, gathered, never computed
    c = compile_tree(tree, 0)
    links = (tree.parents, c.retrieve_next_token, c.retrieve_next_sibling)
    assert torch.equal(gdn_tree_conv("torch", x, win, w, b, "silu", *links)[0],
                       tree_causal_conv1d_levels(x, win, w, b, "silu", tree.parents)[0])
    assert torch.equal(gdn_tree_conv("torch-oracle", x, win, w, b, "silu", *links)[0],
                       tree_causal_conv1d(x, win, w, b, "silu", tree.parents)[0])


@pytest.mark.parametrize("name", list(FAST_TREES))
@pytest.mark.parametrize("shape,ties", [((1, 2, 4, 8), False), ((1, 2, 4, 8), True), ((2, 4, 8, 4), False),
                                        ((1, 1, 6, 4), False)])
def test_level_delta_rule_equals_oracle(name, shape, ties):
    """Depth-at-a-time delta rule == the per-node oracle: outputs and every node's state; and through the
    dispatch (g, beta given, and from the raw gates)."""
    tree = FAST_TREES[name]
    q, k, v, g, beta, state = delta_inputs(sum(shape) + 20, tree, *shape, ties)
    ref_out, ref_states = tree_gated_delta_rule(q, k, v, g, beta, state, tree.parents)
    out, states = tree_gated_delta_rule_levels(q, k, v, g, beta, state, tree.parents)
    assert (out - ref_out).abs().max() < 1e-6, name
    assert (states - ref_states).abs().max() < 1e-6, name
    assert torch.equal(gdn_tree_delta_rule("torch", q, k, v, g, beta, state, tree.parents)[1], states)
    HV = shape[1]
    gen = torch.Generator().manual_seed(9)
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    a, b = torch.randn(*g.shape, generator=gen), torch.randn(*g.shape, generator=gen)
    fast = gdn_tree_delta_rule_gated("torch", q, k, v, A_log, dt_bias, a, b, state, tree.parents)
    oracle = gdn_tree_delta_rule_gated("torch-oracle", q, k, v, A_log, dt_bias, a, b, state, tree.parents)
    assert (fast[0] - oracle[0]).abs().max() < 1e-6 and (fast[1] - oracle[1]).abs().max() < 1e-6


def test_level_path_leaves_its_inputs_alone_and_rejects_what_the_oracle_rejects():
    tree = FAST_TREES["padded-bs3-n10"]
    x, win, w, b = conv_inputs(0, tree, 6, 4, False)
    q, k, v, g, beta, state = delta_inputs(0, tree, 1, 2, 4, 4, False)
    before = [t.clone() for t in (x, win, q, k, v, g, beta, state)]
    tree_causal_conv1d_levels(x, win, w, b, "silu", tree.parents)
    tree_gated_delta_rule_levels(q, k, v, g, beta, state, tree.parents)
    assert all(torch.equal(s, t) for s, t in zip(before, (x, win, q, k, v, g, beta, state)))
    bad = tree.parents.clone()
    bad[0, 2] = 3  # a parent after its child
    with pytest.raises(ValueError, match="tree_causal_conv1d_levels: parents must be -1 at the root"):
        tree_causal_conv1d_levels(x, win, w, b, "silu", bad)
    with pytest.raises(ValueError, match="tree_gated_delta_rule_levels: parents must be -1 at the root"):
        tree_gated_delta_rule_levels(q, k, v, g, beta, state, bad)
    with pytest.raises(ValueError, match=r"tree_gated_delta_rule_levels: want q, k"):
        tree_gated_delta_rule_levels(q, k, v[:, :, :1], g, beta, state, tree.parents)  # HV 1 != g's 2
