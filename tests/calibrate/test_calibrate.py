"""python -m workbench.calibrate: its prompts never touch an evaluation prompt, its cost sources read as the
policies read them, the path states follow the kernel's rule, and a small run writes a file the policies take
on that pair and refuse on the other."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import workbench as wb
from ddtree_kernels.path_tree import OFF, SIBLING, SPINE
from workbench.calibrate.command import main
from workbench.calibrate.costs import CostInputError, from_pays_off, read_costs
from workbench.calibrate.fit import path_states
from workbench.calibrate.prompts import calibration_prompts, evaluation_texts, overlaps
from workbench.engine.policies import CutTree, PathTree
from workbench.engine.policies.calibration import CalibrationError, load
from workbench.train.corpus import is_held_out


def test_calibration_prompts_are_training_text_apart_from_every_evaluation_prompt():
    items, kept = calibration_prompts(60, seed=0)
    texts, sources = evaluation_texts()  # both shipped splits (the embedded pairs share them)
    assert len(texts) > 60 and len(sources) > 20
    assert len(items) == 60 and len({it["prompt"] for it in items}) == 60
    for it in items:
        assert not is_held_out(it["source"]) and it["source"] not in sources
        assert not overlaps(it["prompt"], texts)
    assert kept["evaluation_prompts_checked"] == len(texts)
    assert calibration_prompts(60, seed=0)[0] == items  # the same prompts on every run (one interpreter)


def test_path_states_follow_the_kernels_rule():
    K = 4
    ranks = np.array([[0, 0, 2, 0, 0, 1], [1, 0, 0, K, 0, 0], [0, -1, 0, 0, 0, 0]])
    state, usable = path_states(ranks, K)
    assert state[0].tolist() == [SPINE, SPINE, SPINE, SIBLING, OFF, OFF]
    assert state[1].tolist()[:4] == [SPINE, SIBLING, OFF, OFF]
    assert usable[1].tolist() == [True, True, True, True, False, False]  # past a token beyond the candidates
    assert usable[2].tolist() == [True, False, False, False, False, False]  # unknown from slot 1 on


def test_a_pays_off_result_becomes_a_cost_table():
    row = lambda label, fam, v, d=5.0: {"label": label, "family": fam, "step_ms": {  # noqa: E731
        "draft": d, "tree": 0.5, "verify": v, "accept": 0.2, "commit": 0.2, "host": 0.2, "total": d + v + 1.1}}
    res = {"settings": {"block_size": 16, "prompts": 10, "max_new_tokens": 32, "device": "cpu"}, "batches": {
        "1": {"shapes": [row("AR", "ar", 6.0, 0.0), row("DFlash", "chain", 9.0), row("DDTree(4)", "tree", 8.0),
                         row("DDTree(32)", "tree", 13.0)]},
        "8": {"shapes": [row("AR", "ar", 11.0, 0.0), row("DFlash", "chain", 25.0), row("DDTree(4)", "tree", 15.0),
                         row("DDTree(32)", "tree", 40.0, 12.0)]}}}
    c = from_pays_off(res, "r.json")
    assert c.rows == (1, 8) and c.nodes == (1, 5, 16, 33)
    # other = the median over drafted shapes of draft + tree + accept + commit + host (6.1 at both batches)
    assert c.ms(1, 5) == pytest.approx(8.0 + 6.1) and c.ms(8, 33) == pytest.approx(40.0 + 6.1)
    assert c.ms(8, 9) > c.ms(1, 9) and c.ms(4, 5) == pytest.approx((14.1 * 4 + 21.1 * 3) / 7)
    # pays-off's default set holds CostTree(64) and CutTree(16), which verify fewer nodes than their cap per cycle:
    # their verify is no measurement of 65 or 17 nodes, so they add no point (PathTree(16)'s 17 nodes are real)
    for b, extra in (("1", [row("CostTree(64)", "cost-tree", 8.5), row("CutTree(16)", "cut-tree", 8.2),
                            row("PathTree(16)", "path-tree", 10.0)]),
                     ("8", [row("CostTree(64)", "cost-tree", 14.0), row("CutTree(16)", "cut-tree", 20.0),
                            row("PathTree(16)", "path-tree", 30.0)])):
        res["batches"][b]["shapes"] += extra
    c = from_pays_off(res, "r.json")
    assert c.nodes == (1, 5, 16, 17, 33) and c.ms(8, 17) == pytest.approx(30.0 + 6.1)


def test_bad_cost_sources_are_one_line(tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    for src, msg in ((tmp_path / "none.json", "is not a file"), (tmp_path / "x.json", "cost table is malformed")):
        with pytest.raises(CostInputError, match=msg):
            read_costs(str(src))
    assert read_costs("dense").rows == (1, 8) and read_costs("hybrid").rows == (1, 4)


@pytest.mark.slow
def test_a_small_calibration_is_taken_on_its_pair_and_refused_on_the_other(tmp_path, engine, capsys, monkeypatch):
    out = tmp_path / "cal.json"
    out.write_text("{}")  # an earlier file: written over only with --replace, atomically
    replaced = []
    monkeypatch.setattr("workbench.records.files.os.replace", lambda a, b: replaced.append(b) or os.rename(a, b))
    assert main(["--target", "dense", "--out", str(out), "--prompts", "24", "--max-new-tokens", "32",
                 "--threads", "1", "--quiet", "--replace"]) == 0
    assert replaced == [out] and [p.name for p in tmp_path.iterdir()] == ["cal.json"]
    d = json.loads(out.read_text())
    assert d["made"]["cycles"] >= 200 and d["made"]["prompts"]["count"] == 24 and d["made"]["date"]
    assert set(d["thresholds"]) == {"tree", "chain"} and d["cost"]["rows"] == [1, 8]
    cal = load(str(out))
    s = engine.session("def f(x):\n    ", policy=CutTree(8, calibration=str(out)), max_new_tokens=12)
    ref = engine.session("def f(x):\n    ", policy=wb.AR(), max_new_tokens=12)
    assert s.run() and ref.run() and s.tokens == ref.tokens and cal.cycles == d["made"]["cycles"]
    with pytest.raises(CalibrationError, match="made on another pair"):
        wb.load("hybrid").session("x", policy=PathTree(8, calibration=str(out)), max_new_tokens=4)
    assert main(["--target", "dense", "--out", str(tmp_path / "few.json"), "--prompts", "3", "--max-new-tokens",
                 "16", "--quiet"]) == 2
    assert "the estimate needs at least 200" in capsys.readouterr().err
