"""The tree-build stage builds a cycle's rows of one batched policy together (``tree_build_rows``): every row's
tree equals the tree it gets alone, field for field, on random drafts with mixed policies and depths, and the
rows' records still share the top-k their trees were built from."""
from __future__ import annotations

import pytest
import torch

import workbench as wb
from ddtree_kernels import validate_tree
from workbench.engine.policies import CostTree, CutTree, PairChain, PairTree, PathTree
from workbench.engine.stages.draft import Draft
from workbench.engine.stages.tree_build import tree_build, tree_build_rows

VOCAB = 4096  # the embedded pairs' vocabulary: the shipped calibrations and pair head are made for it
FIELDS = ("tokens", "parents", "depth", "rank", "score")


def drafts(seed: int, depths: list[int]) -> list[Draft]:
    g = torch.Generator().manual_seed(seed)
    return [Draft(torch.log_softmax(torch.randn(1, d, VOCAB, generator=g) * 4, dim=-1), None) for d in depths]


@pytest.mark.parametrize("seed", range(4))
def test_rows_built_together_equal_each_built_alone(seed, monkeypatch):
    pols = [wb.DDTree(8), PathTree(8, calibration="dense"), PairTree(8, calibration="dense"),
            CutTree(8, threshold=0.05, calibration="dense"), CostTree(16, calibration="dense"),
            wb.DDTree(6, width=2), PairChain(4, calibration="dense"), wb.DFlash()]
    assert all(p.batched_build for p in pols[:6]) and not any(p.batched_build for p in pols[6:])
    # three rows of each policy: two of one depth (built together) and one shorter (built apart)
    rows = [(p, d) for p in pols for d in (15, 15, 9)]
    g = torch.Generator().manual_seed(100 + seed)
    roots = torch.randint(0, VOCAB, (len(rows),), generator=g).tolist()
    together_drafts = drafts(seed, [d for _, d in rows])
    alone_drafts = [Draft(d.logprobs.clone(), None) for d in together_drafts]
    sizes = []
    for cls in {type(p) for p in pols[:6]}:
        monkeypatch.setattr(cls, "build_rows", lambda self, d, r, sf, f=cls.build_rows: sizes.append(len(r)) or
                            f(self, d, r, sf))
    got = tree_build_rows([p for p, _ in rows], together_drafts, roots, "cpu")
    assert sizes.count(2) == 6 and max(sizes) == 2  # each batched policy's two rows of one depth, in one call
    monkeypatch.undo()
    for b, ((p, _), r) in enumerate(zip(rows, roots)):
        want = tree_build(p, alone_drafts[b], r, "cpu")
        for f in FIELDS:
            assert torch.equal(getattr(got[b], f), getattr(want, f)), (p, b, f)
        assert got[b].tokens.shape[0] == 1
        validate_tree(got[b], got[b].n - 1, VOCAB, torch.tensor([r]))
        # the row's own top-k is the one its tree came from (the record reads it without a second top-k)
        if p.batched_build:
            assert together_drafts[b]._top is not None
            v, i = together_drafts[b].top(4)
            assert torch.equal(i, alone_drafts[b].top(4)[1]) and torch.equal(v, alone_drafts[b].top(4)[0])


def test_a_lone_row_and_rows_without_drafts_take_the_single_path():
    ds = drafts(7, [15])
    got = tree_build_rows([wb.DDTree(8), wb.AR()], [ds[0], None], [3, 4], "cpu")
    assert got[0].tokens.shape == (1, 9) and got[1].tokens.shape == (1, 1)
    assert got[1].tokens.tolist() == [[4]]
