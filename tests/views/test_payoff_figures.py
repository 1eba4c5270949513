"""pays-off's results and the policies' counts as figures: values per policy and batch with their intervals."""
from __future__ import annotations

import json

import pytest

from workbench import views
from workbench.analysis.paired import PairedRatio
from workbench.payoff import PaysOff
from workbench.payoff.verdict import BatchVerdict, ShapeRow


def row(label: str, family: str, tpf: float, ratios=None) -> ShapeRow:
    r = ShapeRow(label, family, tpf, tpf, 1 / tpf, {"total": 10.0}, 5)
    if ratios is not None:
        r.measured_vs_chain = PairedRatio(label, "DFlash", tuple(ratios), 0.125, 0.125)  # the figures read no p
    return r


def result() -> PaysOff:
    """Batch 1, and batch 8 static and refilled: DFlash, DDTree(8) and CondTree(8)."""
    def rows(k):
        return [row("DFlash", "chain", 3.0), row("DDTree(8)", "tree", 3.3 * k, [1.0, 1.1, 1.2, 1.3]),
                row("CondTree(8)", "cond-tree", 3.6 * k, [1.1, 1.2, 1.3, 1.4])]
    return PaysOff(settings={}, batches={1: BatchVerdict(1, 4, rows(1.0)), 8: BatchVerdict(8, 4, rows(1.1))},
                   refilled={8: BatchVerdict(8, 4, rows(1.2), mode="refilled")})


def test_payoff_figure_draws_each_batch_and_mode_with_its_interval():
    res = result()
    fig = views.payoff_figure(res)
    bars = {(t.name, t.yaxis): t for t in fig.data}
    assert [t.name for t in fig.data if t.yaxis == "y"] == ["batch 1", "batch 8, static", "batch 8, refilled"]
    refilled = bars["batch 8, refilled", "y"]
    assert list(refilled.x) == ["DFlash", "DDTree(8)", "CondTree(8)"]
    assert list(refilled.y) == pytest.approx([3.0, 3.96, 4.32])  # tokens per forward: exact counts, no interval
    speed = bars["batch 1", "y2"]
    assert list(speed.y) == pytest.approx([1.0, 1.15, 1.25])  # the median per-unit ratio over DFlash
    iqr = res.batches[1].row("CondTree(8)").measured_vs_chain.iqr
    assert speed.error_y.array[2] == pytest.approx(iqr[1] - 1.25) and speed.error_y.arrayminus[2] == pytest.approx(
        1.25 - iqr[0])
    assert speed.error_y.array[0] is None  # DFlash over itself: no interval
    # the JSON result (`pays-off --json`: greedy and sampled) draws the same figure
    again = views.payoff_figure(json.loads(json.dumps({"greedy": res.to_dict(), "sampled": None})))
    assert [list(t.y) for t in again.data] == [list(t.y) for t in fig.data]


def test_next_top1_figure_groups_each_scorer_by_path_state():
    acc = {"marginal": {"spine": {"slots": 90, "top1": 0.7}, "sibling": {"slots": 20, "top1": 0.15},
                        "off": {"slots": 0, "top1": None}},
           "table": {"spine": {"slots": 90, "top1": 0.72}, "sibling": {"slots": 20, "top1": 0.37},
                     "off": {"slots": 0, "top1": None}},
           "learned": {"spine": {"slots": 90, "top1": 0.75}, "sibling": {"slots": 20, "top1": 0.5},
                       "off": {"slots": 0, "top1": None}}}
    fig = views.next_top1_figure(acc)
    assert [t.name for t in fig.data] == ["drafter&#x27;s marginal (as drafted)", "successor table", "learned head"]
    assert list(fig.data[2].x) == ["on the spine (n=90)", "right after a sibling (n=20)"]  # no slot: no bar
    assert list(fig.data[2].y) == pytest.approx([75.0, 50.0])
    assert "nothing measured" in views.by_policy_figure({}, "x").layout.annotations[0].text
