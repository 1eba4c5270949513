"""The model-state interface: the dense state's mask, its description and its place behind the protocol."""
from __future__ import annotations

import torch

import workbench as wb
from ddtree_kernels import build_tree, compile_tree
from workbench.models.layout import TreeLayout
from workbench.models import DenseKV, PrefixMask, StateSpec, TargetState, new_target_state, register_target_state


def fresh_mask(vis: torch.Tensor, starts: list[int]) -> torch.Tensor:
    """What the buffer must equal: row b sees columns < starts[b] and its tree block, nothing else."""
    B, N, _ = vis.shape
    W = max(starts) + N
    visible = torch.zeros(B, N, W, dtype=torch.bool)
    for b, s in enumerate(starts):
        visible[b, :, :s] = True
        visible[b, :, s : s + N] = vis[b]
    return torch.zeros(B, 1, N, W).masked_fill(~visible[:, None], float("-inf"))


def random_layout(g, starts, budgets):
    trees, comps = [], []
    for b, (s, k) in enumerate(zip(starts, budgets)):
        lp = torch.log_softmax(torch.randn(1, 5, 20, generator=g), -1)
        t = build_tree(lp, torch.tensor([b]), k)
        trees.append(t)
        comps.append(compile_tree(t, s, 5))
    return TreeLayout.of_rows(trees, comps, starts, [5] * len(starts))


def test_prefix_mask_equals_a_fresh_mask_for_ragged_rows_every_cycle():
    """Rows at different starts grow by different amounts, trees change size, rows retire, the buffer grows."""
    g = torch.Generator().manual_seed(1)
    buf = PrefixMask(torch.float32, torch.device("cpu"))
    starts = [3, 11, 0, 7]
    for cycle in range(12):
        budgets = [int(torch.randint(1, 40, (1,), generator=g)) for _ in starts]
        lay = random_layout(g, starts, budgets)
        got = buf.tree(lay.visibility, starts)
        assert torch.equal(got, fresh_mask(lay.visibility, starts)), (cycle, starts, budgets)
        starts = [s + int(torch.randint(1, min(n, 6) + 1, (1,), generator=g)) for s, n in zip(starts, lay.n)]
        if cycle == 5:  # a request retires: its row leaves the buffer
            buf.select([0, 2, 3])
            starts = [starts[0], starts[2], starts[3]]
        if cycle == 8:
            starts = [starts[0] + 300, starts[1], starts[2]]  # past the buffer's columns: it grows


def test_layout_hops_scatter_to_visibility():
    g = torch.Generator().manual_seed(2)
    lay = random_layout(g, [4, 9], [12, 30])
    vis = torch.zeros_like(lay.visibility).scatter_(2, lay.hops, True)
    assert lay.padded
    for b, n in enumerate(lay.n):  # real nodes; padding nodes' hops reach the root, but they see only themselves
        assert torch.equal(vis[b, :n, :n], lay.visibility[b, :n, :n]) and not vis[b, :n, n:].any()


def test_dense_state_is_a_target_state_and_describes_what_it_holds(tiny_engines):
    engine = tiny_engines["l3-h48-b5"]
    s = engine.session("t3 t1 t4 t1 t5", policy=wb.DDTree(6), max_new_tokens=12)
    s.run()
    state = s._rows.target
    assert isinstance(state, DenseKV) and isinstance(state, TargetState)
    specs = state.describe()
    assert [x.name for x in specs] == ["keys", "values"] and all(isinstance(x, StateSpec) for x in specs)
    assert specs[0].shape[2] == s.start and sum(x.bytes for x in specs) == state.nbytes() > 0
    ahead = state.describe(batch=4, length=100, nodes=33)
    assert ahead[0].shape[:3] == (4, ahead[0].shape[1], 133)
    assert s.cache_bytes() == state.nbytes() + s._rows.draft.nbytes()


def test_a_registered_state_class_is_picked_by_its_detector(tiny_engines):
    m = tiny_engines["l4-h32"].models
    marker = object()
    register_target_state(lambda config: getattr(config, "_wb_test_marker", None) is marker,
                          lambda models, capture: ("picked", models))
    try:
        assert isinstance(new_target_state(m), DenseKV)  # the fallback
        m.target.config._wb_test_marker = marker
        assert new_target_state(m) == ("picked", m)
    finally:
        del m.target.config._wb_test_marker
        from workbench.models import registry

        registry._TARGET_STATES.pop(0)


def test_crop_rolls_rows_back_and_refuses_growth(tiny_engines):
    import pytest

    s = tiny_engines["l4-h32"].session("t1 t2 t3", policy=wb.DDTree(4), max_new_tokens=10)
    s.step()
    state = s._rows.target
    n = state.lengths[0]
    with pytest.raises(ValueError, match="at most"):
        state.crop([n + 1])
    state.crop([3])
    assert state.lengths == [3] and state.view(0)[0][0].shape[2] == 3
