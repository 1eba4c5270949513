"""The EAGLE-style tree: vectorized selection == SGLang's step loop in plain Python, and our
compile_tree == SGLang's own build kernel (positions, retrieve arrays, both mask layouts)."""
from __future__ import annotations

import pytest
import torch

import workbench as wb
from ddtree_kernels import compile_tree
from ddtree_kernels.eagle_tree import build_eagle_tree, eagle_select, eagle_tree
from ddtree_kernels.mask_layout import MASK_MODES, flat_tree_mask, mask_elements
from ddtree_kernels.oracles import ancestors_python, compile_sglang_python, eagle_select_python

SHAPES = [(1, 1, 2), (4, 1, 5), (2, 3, 6), (3, 4, 12), (4, 5, 16), (2, 8, 16), (8, 3, 60), (4, 6, 79)]


def random_logprobs(seed, bs, D, V, ties=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, D, V, generator=g) * 3
    if ties:  # many exactly equal values: exercises the tie rule
        logits = logits.round()
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("topk,steps,n", SHAPES)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ties", [False, True])
def test_vectorized_selection_equals_step_loop_oracle(topk, steps, n, seed, ties):
    lp = random_logprobs(seed, 3, 8, 30, ties)
    sel = eagle_select(lp, topk, steps, n)
    for b in range(3):
        ref = eagle_select_python(lp[b], topk, steps, n)
        assert sel.parent_list[b].tolist() == ref["parent_list"]
        assert sel.selected_index[b].tolist() == ref["selected_index"]
        for f in ("tokens", "parents", "depth", "rank"):
            assert getattr(sel, f)[b].tolist() == ref[f], f
        assert sel.score[b].tolist() == pytest.approx(ref["score"], abs=0)


@pytest.mark.parametrize("topk,steps,n", SHAPES)
def test_eagle_tree_is_a_valid_prefix_closed_tree(topk, steps, n):
    from ddtree_kernels import validate_tree

    lp = random_logprobs(topk * 10 + steps, 4, 8, 40, ties=True)
    tree = build_eagle_tree(lp, torch.arange(4), topk, steps, n)
    assert tree.n == n
    validate_tree(tree, n - 1, 40, torch.arange(4), steps)
    assert int(tree.depth.max()) <= steps and int(tree.rank.max()) < topk
    # Nodes scored along their path: child = parent + its slot's log-prob of the token.
    par = tree.parents[:, 1:]
    step = lp.gather(2, torch.stack([tree.tokens[:, 1:]] * 8, 1))  # [bs, 8, n-1]
    step = step.gather(1, (tree.depth[:, 1:] - 1)[:, None])[:, 0]
    torch.testing.assert_close(tree.score[:, 1:], tree.score.gather(1, par) + step, rtol=0, atol=1e-5)


def test_topk_one_is_the_argmax_chain_and_full_tree_keeps_every_candidate():
    lp = random_logprobs(5, 2, 6, 20)
    chain = build_eagle_tree(lp, torch.tensor([1, 2]), 1, 6, 7)
    assert chain.parents[0].tolist() == list(range(-1, 6))
    assert torch.equal(chain.tokens[:, 1:], lp.argmax(-1))
    full = build_eagle_tree(lp, torch.tensor([1, 2]), 3, 3, 1 + 3 + 2 * 9)
    assert full.n == 22


def test_same_verified_tokens_as_ddtree_and_bad_shapes():
    assert wb.EagleTree(4, 5, 16).budget == wb.DDTree(15).budget
    with pytest.raises(ValueError, match="num_draft_tokens=40 needs 39 candidates but topk=2, steps=3 make only 10"):
        wb.EagleTree(topk=2, steps=3, num_draft_tokens=40)
    with pytest.raises(ValueError, match="topk=0"):
        wb.EagleTree(topk=0)
    with pytest.raises(ValueError, match=r"steps=9\) needs at least 9 drafted slots"):
        eagle_select(random_logprobs(0, 1, 4, 10), 2, 9, 5)
    assert wb.parse_policy("eagle:4:5:16") == wb.EagleTree(4, 5, 16)
    with pytest.raises(ValueError, match="eagle:TOPK:STEPS:N"):
        wb.parse_policy("eagle:4")


# ------------------------------------------------------------------------- our compile vs SGLang's kernel
def mask_python(vis_rows, seq_lens, mode):
    """SGLang's flat layout written out the slow way from per-request [n][n] lists."""
    out = []
    for rows, s in zip(vis_rows, seq_lens):
        for row in rows:
            out += ([True] * s if mode == "FULL_MASK" else []) + list(row)
    return out


def test_mask_layout_matches_a_slow_flattening():
    g = torch.Generator().manual_seed(0)
    vis = torch.rand(3, 4, 4, generator=g) > 0.5
    seq = torch.tensor([2, 0, 5])
    for mode in MASK_MODES:
        got = flat_tree_mask(vis, seq, mode)
        assert got.numel() == mask_elements(mode, [2, 0, 5], 4)
        assert got.tolist() == mask_python(vis.tolist(), [2, 0, 5], mode)
    assert mask_elements("FULL_MASK", [2, 0, 5], 4) == 7 * 4 + 16 * 3
    with pytest.raises(ValueError, match="'BITS' is not one of FULL_MASK, QLEN_ONLY"):
        mask_elements("BITS", [1], 2)


def assert_compiles_agree(sel, tree, seq_lens, topk, steps):
    """Ours (compile_tree + flat_tree_mask) == SGLang's kernel == the plain-Python rules."""
    from ddtree_kernels.sglang_backend import build_tree_efficient

    n = tree.n
    ct = compile_tree(tree, seq_lens, n - 1)
    for b in range(seq_lens.numel()):
        ref = compile_sglang_python(tree.parents[b].tolist(), int(seq_lens[b]))
        assert ct.positions[b].tolist() == ref["positions"]
        assert ct.retrieve_next_token[b].tolist() == ref["next_token"]
        assert ct.retrieve_next_sibling[b].tolist() == ref["next_sibling"]
        assert ct.visibility[b].tolist() == ref["mask"]
    for mode in MASK_MODES:
        theirs = build_tree_efficient(sel.parent_list, sel.selected_index, seq_lens, topk, steps, n, mode)
        assert torch.equal(theirs["positions"], ct.positions.reshape(-1)), mode
        assert torch.equal(theirs["retrieve_index"], ct.retrieve_index), mode
        assert torch.equal(theirs["retrieve_next_token"], ct.retrieve_next_token), mode
        assert torch.equal(theirs["retrieve_next_sibling"], ct.retrieve_next_sibling), mode
        ours = flat_tree_mask(ct.visibility, seq_lens, mode)
        assert theirs["tree_mask"].shape == ours.shape, mode
        assert torch.equal(theirs["tree_mask"], ours), mode


@pytest.mark.parametrize("topk,steps,n", [(1, 4, 5), (2, 3, 6), (4, 5, 16), (3, 6, 20)])
def test_compile_equals_sglang_build_kernel_on_random_trees(topk, steps, n):
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    lp = random_logprobs(topk + n, 3, 7, 25, ties=True)
    sel = eagle_select(lp, topk, steps, n)
    tree = eagle_tree(sel, torch.tensor([3, 4, 5]))
    assert_compiles_agree(sel, tree, torch.tensor([6, 1, 11]), topk, steps)


def test_compile_equals_sglang_build_kernel_on_real_trees(engine, eval_prompts):
    """Trees of real cycles: a TreePolicy records the drafter's log-probs and builds the EAGLE tree."""
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    topk, steps, n = 4, 5, 16
    seen = []

    def recording(lp, roots, budget):
        seen.append((lp.clone(), roots.clone()))
        st = min(steps, lp.shape[1])  # the last cycles draft fewer slots
        return build_eagle_tree(lp, roots, topk, st, min(budget + 1, 1 + topk + (st - 1) * topk * topk))

    s = engine.session(eval_prompts[1]["prompt"], policy=wb.TreePolicy(recording, "eagle-rec", n - 1),
                       max_new_tokens=24)
    s.run()
    ref = engine.session(eval_prompts[1]["prompt"], policy=wb.EagleTree(topk, steps, n), max_new_tokens=24)
    ref.run()
    assert s.tokens == ref.tokens and len(seen) == sum(c.n_nodes > 0 for c in ref.cycles)
    for (lp, roots), c in zip(seen[:4], ref.cycles):
        sel = eagle_select(lp, topk, steps, n)
        tree = eagle_tree(sel, roots)
        assert tree.tokens[0].tolist() == c.tokens.tolist() and tree.parents[0].tolist() == c.parents.tolist()
        assert_compiles_agree(sel, tree, torch.tensor([c.start]), topk, steps)
    # the rows of our verify mask are SGLang's FULL_MASK rows for this request
    c = ref.cycles[0]
    assert (ancestors_python(c.parents.tolist())[5]) == {j for j in range(n) if c.visibility[5, j]}
