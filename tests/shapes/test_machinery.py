"""The tree machinery term (workbench/shapes/machinery.py) and its place in wb.shapes.cost: the fit is a median
per group on hand-made rows, the levels fall back engine+graph -> graph -> all, a chain pays none, and the
shipped FITTED shares are what the public figures give today."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import workbench as wb
from workbench.shapes import machinery
from workbench.shapes import published as pub


def rows_of(*spec):
    """Hand-made rows: (engine, graph, the share that row alone prefers)."""
    return [SimpleNamespace(engine=e, graph=g, own=v) for e, g, v in spec]


def l1(rows, share):
    return sum(abs(share - r.own) for r in rows)  # minimised by the median of the rows' own shares


def test_fit_share_minimises_the_loss_and_takes_the_median_of_ties():
    assert machinery.fit_share(lambda s: abs(s - 0.3)) == pytest.approx(0.3)
    # two rows at 0.1 and 0.5: every share between costs the same; the fit takes the middle of the flat part
    assert machinery.fit_share(lambda s: abs(s - 0.1) + abs(s - 0.5)) == pytest.approx(0.3)
    assert machinery.fit_share(lambda s: abs(s - 5.0)) == machinery.SHARE_GRID[-1]  # clipped to the grid


def test_fit_is_a_median_per_group_per_graph_and_overall():
    rows = rows_of(("vllm", "graphs", 0.2), ("vllm", "graphs", 0.4), ("vllm", "graphs", 0.9),
                   ("ggml", "compiled", 0.1), ("hipfire", "compiled", 0.7), ("hf", "eager", 0.0))
    m = machinery.fit(rows, l1)
    assert m.shares[("vllm", "graphs")] == pytest.approx(0.4)
    assert m.shares[("ggml", "compiled")] == pytest.approx(0.1)
    assert m.by_graph["compiled"] == pytest.approx(0.4)  # 0.1 and 0.7: the middle of the tie
    assert m.overall == pytest.approx(0.3)  # median of 0, 0.1, 0.2, 0.4, 0.7, 0.9
    assert m.fitted_on == 6
    assert machinery.fit([], l1) == machinery.TreeMachinery()


def test_fit_reads_only_the_rows_it_is_given():
    rows = rows_of(("vllm", "graphs", 0.2), ("vllm", "graphs", 0.4))
    seen = []

    def loss(group, share):
        seen.extend(id(r) for r in group)
        return l1(group, share)

    machinery.fit(rows, loss)
    assert set(seen) == {id(r) for r in rows}


def test_share_falls_back_engine_graph_then_graph_then_all():
    m = machinery.TreeMachinery({("vllm", "graphs"): 0.4}, {"graphs": 0.3, "eager": 0.05}, 0.2)
    assert m.share("vllm", "graphs") == (0.4, "engine+graph")
    assert m.share("sglang", "graphs") == (0.3, "graph")
    assert m.share("vllm", "eager") == (0.05, "graph")
    assert m.share("mlx", "compiled") == (0.2, "all")
    assert m.seconds(0.030, "vllm", "graphs") == pytest.approx(0.012)
    assert m.seconds(0.030, "vllm", "graphs", tree_steps=0.25) == pytest.approx(0.003)
    with pytest.raises(ValueError, match=r"tree_steps=0 is a share of steps in \(0, 1\]"):
        m.seconds(0.030, "vllm", "graphs", tree_steps=0)
    assert m.rows()[-1] == {"engine": "*", "graph": "*", "share": 0.2}


def test_shipped_shares_are_what_the_public_figures_give():
    fitted = pub.fit_all([pub.price(f) for f in pub.FIGURES])
    assert fitted == machinery.FITTED, ("workbench/shapes/machinery.py FITTED is stale: paste "
                                        f"{fitted} (python -m workbench.shapes.published prints the shares)")


def test_cost_adds_the_machinery_to_a_tree_cycle_only():
    kw = dict(gpu="H200", budgets=[15, 16], draft_config="qwen3-8b-dflash-b16", overhead_s=4e-3)
    plain = wb.shapes.cost("qwen3-8b", **kw)
    m = machinery.TreeMachinery({("vllm", "graphs"): 0.25}, {}, 0.0)
    t = wb.shapes.cost("qwen3-8b", engine="vllm", graph="graphs", tree_machinery=m, **kw)
    c = t.cycle_seconds(16)
    step = c["draft_s"] + c["verify_s"] + c["overhead_s"]
    assert c["machinery_s"] == pytest.approx(0.25 * step) and c["cycle_s"] == pytest.approx(1.25 * step)
    assert t.cycle_seconds(15, tree=False)["machinery_s"] == 0.0
    assert plain.cycle_seconds(16)["machinery_s"] == 0.0  # no engine named: no term, as before
    assert plain.cycle_seconds(16)["cycle_s"] == pytest.approx(step)
    s = t.speedup({16: 4.0}, dflash_tau=3.5)
    tree, chain = s.rows[0], s.rows[1]
    assert tree["machinery_s"] == pytest.approx(0.25 * step) and chain["machinery_s"] == 0.0
    assert tree["vs_dflash"] < plain.speedup({16: 4.0}, dflash_tau=3.5).rows[0]["vs_dflash"]
    assert any("tree machinery (vllm, graphs): 0.250" in n for n in t.notes)


def test_cost_uses_the_fitted_shares_by_default():
    t = wb.shapes.cost("qwen3-8b", budgets=[16], draft_config="qwen3-8b-dflash-b16", engine="vllm", graph="graphs")
    c = t.cycle_seconds(16)
    share = machinery.FITTED.share("vllm", "graphs")[0]
    assert c["machinery_s"] == pytest.approx(share * (c["draft_s"] + c["verify_s"]))


@pytest.mark.parametrize("kw,match", [
    (dict(engine="vllm"), r"engine='vllm', graph=None: the tree machinery term needs both or neither"),
    (dict(graph="graphs"), r"needs both or neither"),
    (dict(engine="vllm", graph="jit"), r"graph='jit' is not one of graphs, eager, compiled"),
])
def test_cost_refuses_half_a_machinery_term(kw, match):
    with pytest.raises(ValueError, match=match):
        wb.shapes.cost("qwen3-8b", **kw)
