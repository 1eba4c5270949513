"""docs/published-figures.md against the code that makes it: the tables are what
``python -m workbench.shapes.published`` prints (so the doc cannot drift from the inputs or the cost model),
every row names its source, and a prediction is the cost model's arithmetic written out here by hand."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

import workbench as wb
from workbench.shapes import published as pub
from workbench.shapes import published_figures as figs

DOC = Path(__file__).resolve().parents[2] / "docs" / "published-figures.md"
START, END = "<!-- published-figures:start -->\n", "<!-- published-figures:end -->"


@pytest.fixture(scope="module")
def preds():
    return pub.predictions()


def doc_block() -> str:
    text = DOC.read_text()
    assert text.count(START) == 1 and text.count(END) == 1, "the doc holds one marked block of tables"
    return text.split(START, 1)[1].split(END, 1)[0]


def test_doc_tables_are_what_the_command_prints(preds, capsys):
    assert pub.main([]) == 0
    printed = capsys.readouterr().out
    assert printed == pub.render_markdown(preds)
    assert doc_block() == printed, ("docs/published-figures.md is stale: paste the output of "
                                    "`python -m workbench.shapes.published` between its markers")


def test_every_row_names_its_source(preds):
    rows = [line for line in doc_block().splitlines() if re.match(r"\| \d+ \| ", line)][:len(figs.FIGURES)]
    assert len(rows) == len(figs.FIGURES) == len(preds)
    for line, fig in zip(rows, figs.FIGURES):
        assert fig.source.strip()
        if fig.url is None:  # only a report that is not public goes without an address, and says so
            assert "not public" in fig.source and f"| {fig.source} |" in line
        else:
            assert fig.url.startswith("https://") and f"[{fig.source}]({fig.url})" in line
    assert sum(f.url is None for f in figs.FIGURES) <= 1
    assert len({f.key for f in figs.FIGURES}) == len(figs.FIGURES)


def test_a_drifted_input_shows_in_the_doc_check(preds):
    """The comparison can fail: one published number changed changes the rendered block."""
    changed = [dataclasses.replace(figs.FIGURES[0], published=0.5)] + list(figs.FIGURES[1:])
    assert pub.render_markdown(pub.predictions(changed)) != doc_block()


def test_every_figure_uses_a_gpu_the_cost_model_knows():
    known = wb.shapes.cost_gpus()
    for fig in figs.FIGURES:
        assert fig.gpu in known, f"{fig.key}: {fig.gpu} is not in workbench/shapes/gpus.json"
        assert known[fig.gpu].source, f"{fig.gpu} has no source"


def test_a_prediction_by_hand():
    """rmagur1203's Qwen3.5-4B pair with CUDA graphs, priced here with the cost table's own forwards."""
    fig = next(f for f in figs.FIGURES if f.key == "rmagur-4b-graphs")
    t = wb.shapes.cost(fig.target, gpu=fig.gpu, batch=1, prompt_len=fig.prompt_len, budgets=[15, 16],
                       draft_config=fig.draft)
    draft = t.forward("DRAFT")["seconds"]
    tree = draft + t.forward("TARGET_VERIFY", 16)["seconds"]
    ref = draft + t.forward("TARGET_VERIFY", 15)["seconds"]
    over = fig.ref_step_s - ref  # the chain's published 26.28 ms less its forwards
    p = pub.predict(fig)
    assert p.tree_s == pytest.approx(tree) and p.ref_s == pytest.approx(ref)
    assert p.overhead_s == pytest.approx(over) and not p.overhead_clamped
    assert p.roofline == pytest.approx((fig.tree.tau / tree) / (fig.ref.tau / ref))
    assert p.with_overhead == pytest.approx((fig.tree.tau / (tree + over)) / (fig.ref.tau / (ref + over)))
    # the tree step the published 0.68x implies, less the model's: what the tree spends beyond its verify
    assert p.implied_tree_s == pytest.approx(fig.tree.tau * 26.28e-3 / (fig.published * fig.ref.tau) - (tree + over))
    assert p.roofline_error == pytest.approx(p.roofline / fig.published - 1)


def test_overhead_from_a_speedup_over_ar_reproduces_it(preds):
    """Calibrated on the reference arm's published speedup over AR, the model gives that speedup back."""
    fig = next(f for f in figs.FIGURES if f.key == "ddtree-paper")
    p = next(p for p in preds if p.figure.key == fig.key)  # the figure with its best-of-sweep budget chosen
    t = wb.shapes.cost(fig.target, gpu=fig.gpu, prompt_len=fig.prompt_len, budgets=[15], draft_config=fig.draft)
    dec = t.decode["seconds"]
    assert fig.ref.tau * (dec + p.overhead_s) / (p.ref_s + p.overhead_s) == pytest.approx(fig.ref_speedup_vs_ar)


def test_rows_without_acceptance_predict_nothing_but_the_tau_ratio_needed(preds):
    for p in preds:
        if p.figure.tree.tau is None:
            assert p.roofline is None and p.with_overhead is None and p.roofline_error is None
            assert p.implied_tau_ratio == pytest.approx(p.figure.published * p.tree_s / p.ref_s)
        else:
            assert p.roofline is not None and p.implied_tau_ratio is None


def test_summary_counts_only_predicted_rows(preds):
    s = pub.summary(preds)
    assert s["roofline"]["figures"] == sum(p.roofline is not None for p in preds)
    assert s["with overhead"]["figures"] == sum(p.with_overhead is not None for p in preds)
    assert 0 <= s["roofline"]["median_abs_error"] <= s["roofline"]["max_abs_error"]


def test_json_holds_every_figure(preds, capsys):
    assert pub.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["figure"]["key"] for r in out["figures"]] == [f.key for f in figs.FIGURES]
    assert all(r["figure"]["url"] is None or r["figure"]["url"].startswith("https://") for r in out["figures"])


@pytest.mark.parametrize("change,match", [
    (dict(tree=figs.Arm("t", 4, 6.0)), r"tau 6.0 outside \[1, budget \+ 1 = 5\]"),
    (dict(ref=figs.Arm("AR", None, 2.0)), r"is AR \(no budget\), so its tau is 1"),
    (dict(url="github.com/x"), r"address is https://..., not 'github.com/x'"),
    (dict(url=None), r"without an address says its source is not public"),
    (dict(source=" "), r"every figure names its source"),
    (dict(ref_speedup_vs_ar=5.0), r"step time or its speedup, not both"),
    (dict(graph="jit"), r"graph 'jit' is not one of graphs, eager, compiled"),
    (dict(engine=" "), r"every figure names its engine kind"),
    (dict(tree_steps=0.0), r"tree_steps 0.0 is a share of steps in \(0, 1\]"),
])
def test_bad_figures_are_refused_in_one_line(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(figs.FIGURES[0], **change)


def test_drafter_layers_follow_the_shipped_rule():
    shipped = wb.shapes.families.load_config("qwen3-8b-dflash-b16")["dflash_config"]["target_layer_ids"]
    assert figs.evenly_spaced_layers(36, 5) == shipped
    assert figs.evenly_spaced_layers(40, 1) == [20]


def test_best_of_sweep_takes_the_largest_budget_the_roofline_prices_free():
    dense = next(f for f in figs.FIGURES if f.key == "ddtree-paper-qwen3-8b")
    t = wb.shapes.cost(dense.target, gpu=dense.gpu, prompt_len=dense.prompt_len, budgets=[16])
    assert pub.best_of_sweep(dense).tree.budget == max(b for b in dense.sweep if b <= t.free_budget)
    moe = next(f for f in figs.FIGURES if f.key == "ddtree-paper")  # batch 1 MoE: no swept budget is free
    assert pub.best_of_sweep(moe).tree.budget == min(moe.sweep)
    assert pub.best_of_sweep(figs.FIGURES[0]) is figs.FIGURES[0]  # a published budget stays
