"""The spine tree build (``ddtree_kernels.spine_tree``) against its plain-Python oracle, on random inputs."""
from __future__ import annotations

import pytest
import torch

from ddtree_kernels import chain_tree, validate_tree
from ddtree_kernels.oracles import spine_tree_python
from ddtree_kernels.spine_tree import spine_tree, spine_tree_from_topk
from ddtree_kernels.tree_build import sorted_slots
from test_kernels import random_logprobs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("siblings", [0, 1, 3, 10, 60])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("ops", ["host", "device-order"])
def test_spine_tree_equals_python_oracle(seed, siblings, ties, ops):
    D, V, bs = 5, 9, 3
    lp = random_logprobs(seed, bs, D, V, ties)
    if seed == 3:
        lp[:, 1, :4] = float("-inf")  # masked tokens rank last and tie among themselves
    roots = torch.arange(bs) + 2
    tree = (spine_tree(lp, roots, siblings) if ops == "host"
            else spine_tree_from_topk(*sorted_slots(lp, min(siblings + 1, V)), roots, siblings))
    for b in range(bs):
        ref = spine_tree_python(lp[b], int(roots[b]), siblings)
        for f in ("tokens", "parents", "depth", "rank"):
            assert getattr(tree, f)[b].tolist() == ref[f], f
        assert tree.score[b].tolist() == pytest.approx(ref["score"], rel=1e-12, abs=1e-12)
    assert tree.n == 1 + D + min(siblings, D * (V - 1))
    validate_tree(tree, D + siblings, V, roots, D)


def test_spine_zero_is_dflash_chain_and_siblings_sit_beside_it():
    lp = random_logprobs(7, 2, 6, 11)
    roots = torch.tensor([1, 4])
    chain = chain_tree(lp.argmax(-1), roots, lp)
    zero = spine_tree(lp, roots, 0)
    for f in ("tokens", "parents", "depth", "rank"):
        assert torch.equal(getattr(zero, f), getattr(chain, f)), f
    torch.testing.assert_close(zero.score, chain.score)
    t = spine_tree(lp, roots, 4)
    sib = slice(7, None)  # root + 6 chain nodes first
    assert torch.equal(t.tokens[:, :7], chain.tokens)
    assert bool((t.rank[:, sib] >= 1).all()) and torch.equal(t.depth[:, sib], t.parents[:, sib] + 1)
    for b in range(2):  # a sibling's token differs from the chain's at its depth; its score extends its parent's
        for node in range(7, t.n):
            d, tok = int(t.depth[b, node]), int(t.tokens[b, node])
            assert tok != int(t.tokens[b, d])
            assert float(t.score[b, node]) == pytest.approx(float(t.score[b, d - 1]) + float(lp[b, d - 1, tok]))
