"""The published figures scored leave-one-source-out (workbench/shapes/published.py): a figure's own number,
nor any of its source's, ever enters its prediction; the lean, the median and the tau-ratio baseline are
computed as written here by hand; the goals say met or not from those numbers."""
from __future__ import annotations

import dataclasses
import statistics
from types import SimpleNamespace

import pytest

from workbench.shapes import machinery
from workbench.shapes import published as pub
from workbench.shapes import published_figures as figs

PLANTED = "patrickbdevaney/dflash-caddtree-integrations"  # a source whose figures train the vLLM-graphs share


@pytest.fixture(scope="module")
def preds():
    return pub.predictions()


def planted(figures, factor: float):
    """Every figure of PLANTED with its published speedup scaled by ``factor``."""
    return tuple(dataclasses.replace(f, published=f.published * factor) if figs.origin_of(f) == PLANTED else f
                 for f in figures)


def test_a_held_out_source_never_fits_its_own_prediction(preds):
    """Halve PLANTED's published speedups: its own predictions do not move (they come from the other sources),
    while the figures it helps fit do move, and fitting on everything would have moved its own."""
    moved = pub.predictions(planted(figs.FIGURES, 0.5))
    mine = [i for i, f in enumerate(figs.FIGURES) if figs.origin_of(f) == PLANTED]
    assert mine
    for i in mine:
        assert moved[i].model == pytest.approx(preds[i].model, rel=1e-12)
        assert moved[i].share == preds[i].share
    others = [i for i, f in enumerate(figs.FIGURES) if figs.origin_of(f) != PLANTED and preds[i].model is not None]
    assert any(moved[i].model != pytest.approx(preds[i].model) for i in others), "the planted rows train nothing"
    # the same plant inside the fit (in-sample) does reach PLANTED's own share: the check above can fail
    in_sample = pub.fit_all([pub.price(f) for f in planted(figs.FIGURES, 0.5)])
    assert in_sample.share("vllm", "graphs") != machinery.FITTED.share("vllm", "graphs")


def test_each_source_is_held_out_as_a_whole():
    priced = [pub.price(f) for f in figs.FIGURES]
    held = pub.leave_one_source_out(priced)
    assert set(held) == {figs.origin_of(f) for f in figs.FIGURES}
    for origin, m in held.items():
        trainers = [p for p in priced if p.trains and figs.origin_of(p.figure) != origin]
        assert m.fitted_on == len(trainers)
    # the paper's rows share one origin under two addresses
    paper = {figs.origin_of(f) for f in figs.FIGURES if f.key.startswith("ddtree-paper")}
    assert paper == {figs.PAPER_ORIGIN}


def test_rows_that_cannot_inform_the_share_do_not_train():
    by_key = {f.key: pub.price(f) for f in figs.FIGURES}
    assert not by_key["hxri-ddtree-vs-ar"].trains  # no reference time: its step is a bare roofline
    assert not by_key["hxri-prop-budget"].trains  # a tree against a tree of the same size
    assert not by_key["users-8x-rtx-pro-6000"].trains  # no acceptance published
    assert by_key["rmagur-4b-graphs"].trains and by_key["lucebox-b64"].trains
    # a non-training row's published value does not reach the fit
    fig = next(f for f in figs.FIGURES if f.key == "hxri-ddtree-vs-ar")
    changed = [dataclasses.replace(f, published=f.published * 3) if f is fig else f for f in figs.FIGURES]
    assert pub.fit_all([pub.price(f) for f in changed]) == machinery.FITTED


def test_score_counts_the_lean_and_takes_the_median_by_hand():
    s = pub.score([0.1, -0.2, 0.3, None, 0.0, -0.05])
    assert s["figures"] == 5
    assert s["median_abs_error"] == pytest.approx(0.1)  # median of 0.1, 0.2, 0.3, 0, 0.05
    assert s["max_abs_error"] == pytest.approx(0.3)
    assert (s["over"], s["under"]) == (2, 2)  # an exact hit leans neither way
    assert pub.score([None])["figures"] == 0


def test_the_tau_ratio_baseline_is_the_rows_own_taus(preds):
    expected = []
    for p in preds:
        f = p.figure
        if f.tree.tau is None:
            assert p.tau_ratio is None and p.tau_ratio_error is None
            continue
        assert p.tau_ratio == pytest.approx(f.tree.tau / f.ref.tau)
        assert p.tau_ratio_error == pytest.approx(f.tree.tau / f.ref.tau / f.published - 1)
        expected.append(abs(f.tree.tau / f.ref.tau / f.published - 1))
    s = pub.summary(preds)["tau ratio"]
    assert s["median_abs_error"] == pytest.approx(statistics.median(expected))
    assert s["figures"] == len(expected)


def test_the_model_by_hand_for_one_figure(preds):
    """rmagur1203's Qwen3.5-4B pair under CUDA graphs: the chain's published 26.28 ms sets the shared overhead,
    and the tree pays its held-out share of its own step on top."""
    i, p = next((i, p) for i, p in enumerate(preds) if p.figure.key == "rmagur-4b-graphs")
    f = p.figure
    s = f.ref_step_s - p.ref_s
    tree = (p.tree_s + s) * (1 + p.share)
    assert p.model == pytest.approx((f.tree.tau / tree) / (f.ref.tau / f.ref_step_s))
    assert p.machinery_s == pytest.approx((p.tree_s + s) * p.share)
    assert p.model_error == pytest.approx(p.model / f.published - 1)
    held = pub.leave_one_source_out([pub.price(g) for g in figs.FIGURES])[figs.origin_of(f)]
    assert (p.share, p.share_level) == held.share(f.engine, f.graph)
    # at share 0 the model is the forwards plus the shared overhead
    assert pub.speedup_at(pub.price(f), 0.0) == pytest.approx(p.with_overhead)


def test_a_share_on_a_fraction_of_steps_and_a_tree_reference():
    ngram = pub.price(next(f for f in figs.FIGURES if f.key == "rmagur-0.6b-ngram"))
    tree, ref = pub.steps(ngram, 0.4)
    s = ngram.figure.ref_step_s - ngram.ref_s
    assert tree == pytest.approx((ngram.tree_s + s) * (1 + 0.4 * 0.28))
    assert ref == pytest.approx(ngram.figure.ref_step_s)
    b64 = pub.price(next(f for f in figs.FIGURES if f.key == "lucebox-b64"))
    tree, ref = pub.steps(b64, 0.4)
    assert ref == pytest.approx(b64.figure.ref_step_s)  # the DDTree(16) reference pays the share too
    s = b64.figure.ref_step_s / 1.4 - b64.ref_s
    assert tree == pytest.approx((b64.tree_s + s) * 1.4)


def test_goals_say_met_from_the_numbers():
    def fake(model, tau):
        return [SimpleNamespace(model_error=m, tau_ratio_error=t, roofline_error=None, overhead_error=None)
                for m, t in zip(model, tau)]

    met = pub.goals(fake([0.05, -0.05, 0.08, -0.02], [0.3, 0.2, 0.25, 0.4]))
    assert [g["met"] for g in met] == [True, True, True]
    missed = pub.goals(fake([0.15, 0.12, 0.2, -0.02], [0.2, 0.2, 0.2, 0.2]))
    assert [g["met"] for g in missed] == [False, False, False]
    assert "3 over, 1 under" in missed[1]["value"]


def test_the_command_reports_every_goal_and_source(preds):
    text = pub.render_markdown(preds)
    for g in pub.goals(preds):
        assert f"| {g['goal']} | {g['value']} | {'yes' if g['met'] else 'no'} |" in text
    for origin in pub.by_source(preds):
        if any(figs.origin_of(p.figure) == origin and p.tau_ratio is not None for p in preds):
            assert f"| {origin} |" in text
    for r in machinery.FITTED.rows():
        assert f"| {r['engine']} | {r['graph']} | {r['share']:.3f} |" in text
