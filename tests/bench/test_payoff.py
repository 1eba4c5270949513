"""pays-off (issue 41): shapes decoded apart and interleaved, forwards counted, what decides, and bad input."""
from __future__ import annotations

import json
import math

import pytest

import workbench as wb
from workbench.payoff import measure, pays_off
from workbench.payoff.shapes import check_fills, default_shapes, family, parse_batches
from workbench.payoff.verdict import what_decides

PROMPTS = [f"t{i} t{i + 3} t{(i * 7) % 40 + 1} t{i + 1}" for i in range(1, 11)]  # 10: the fewest a test takes


def stages(verify: float, rest: float) -> dict:
    return {"draft": rest / 2, "tree_build": 0.0, "tree_compile": 0.0, "verify": verify, "accept": 0.0,
            "commit": rest / 2, "record": 0.0, "other": 0.0}


@pytest.mark.parametrize("gain, verify, rest, factor, pays", [
    (1.30, 1.05, 1.02, "acceptance", True),          # the gain outweighs a slightly wider verify
    (1.01, 1.20, 1.00, "acceptance", False),         # no acceptance gain: nothing can pay for the tree
    (1.15, 1.40, 1.02, "verify width", False),       # the verify's extra width takes more than the gain
    (1.15, 1.02, 1.40, "per-step overhead", False),  # the rest of the step (host work) does
])
def test_what_decides_on_synthetic_steps(gain, verify, rest, factor, pays):
    base = stages(10.0, 10.0)  # a 20 ms step, half of it the verify
    shape = stages(10.0 * verify, 10.0 * rest)
    d = what_decides(gain, base, shape)
    assert d.factor == factor and d.pays == pays
    step_ratio = sum(shape.values()) / sum(base.values())
    assert d.predicted == pytest.approx(gain / step_ratio)  # the prediction is gain x cost ratio, exactly
    assert d.sentence("T", "DFlash").startswith(f"{factor} decides: T commits {gain:.2f}x")


def test_shapes_follow_the_drafters_block():
    labels = [s.label for s in default_shapes(slots=15, vocab=4096)]
    assert labels[:4] == ["AR", "DFlash", "DDTree(4, width=1)", "DDTree(8, width=1)"]
    assert {"Spine(1)", "Spine(2)", "Spine(4)", "DDTree(64)"} <= set(labels)
    small = [s.label for s in default_shapes(slots=4, vocab=3)]  # 3 + 9 + 27 + 81 = 120 prefixes at most
    assert "DDTree(8, width=1)" not in small and "DDTree(64)" in small
    # each policy says what a small vocabulary holds of it (None: it fills)
    assert wb.DDTree(8, width=1).capacity(4, 100) == 4 and wb.DDTree(64).capacity(2, 5) == 30
    assert wb.DDTree(64).capacity(15, 4096) is None and wb.DFlash().capacity(2, 2) is None
    assert wb.Spine(4).capacity(2, 3) is None and wb.Spine(5).capacity(2, 3) == 6  # 2 slots, 2 runners-up each
    with pytest.raises(ValueError, match=r"^Spine\(5\) asks for 7 nodes .* holds at most 6: use a budget <= 6$"):
        check_fills(wb.Spine(5), 2, 3)
    with pytest.raises(ValueError, match=r"^DDTree\(64\) asks for 64 nodes .* holds at most 30"):
        check_fills(wb.DDTree(64), 2, 5)
    # families by the registered kind; an unknown kind is 'other'
    assert [family(p) for p in (wb.AR(), wb.DFlash(), wb.DDTree(8, width=1), wb.Spine(1), wb.DDTree(8))] == \
        ["ar", "chain", "chain-cut", "spine", "tree"]
    assert family(wb.EagleTree(topk=2, steps=2, num_draft_tokens=4)) == "other"


def test_units_are_interleaved_and_rotated(monkeypatch):
    calls = []

    def fake(engine, policy, prompts, max_new_tokens, temperature, seed, record_topk=1):
        calls.append((str(policy), tuple(prompts)))
        return measure.UnitRun(4, 2, 2, 4, 0.01, 0.02, [{"verify": 0.005}], [[1, 2, 3, 4]]), []

    monkeypatch.setattr(measure, "decode_unit", fake)
    shapes = default_shapes(15, 50)[:3]
    sw = measure.run_sweep(None, shapes, ["a", "b", "c"], 2, 8, 0.0, 0, 1, False, type("B", (), {
        "set_postfix_str": lambda *a, **k: None, "update": lambda *a: None})())
    assert [c[1] for c in calls] == [("a", "b")] * 3 + [("b", "c")] * 3 + [("c", "a")] * 3  # unit by unit
    assert [c[0] for c in calls[:3]] == ["AR", "DFlash", "DDTree(4, width=1)"]
    assert [c[0] for c in calls[3:6]] == ["DFlash", "DDTree(4, width=1)", "AR"]  # rotated per unit
    assert sw.units == [[0, 1], [1, 2], [2, 0]]


def test_pays_off_end_to_end_on_a_tiny_pair(tiny_engines):
    eng = tiny_engines["l4-h32"]  # block 8: 7 slots
    res = pays_off(eng, PROMPTS, batch=(1, 2), policies=["ddtree:4", "spine:1"], max_new_tokens=10,
                   warmup=False, progress=False)
    assert set(res.batches) == {1, 2}
    for b, v in res.batches.items():
        assert v.units == 10 and not v.lossless, v.lossless  # every greedy shape equals AR's output
        ar = v.row("AR")
        assert ar.forwards_per_token == pytest.approx(1 / b)  # one forward per token per row: counted, not inferred
        for r in v.rows:
            if r.cost_vs_chain:
                assert r.predicted_vs_chain == pytest.approx(r.gain_vs_chain / r.cost_vs_chain)
                assert r.decision.predicted == pytest.approx(r.predicted_vs_chain)  # one split of one ratio
            if r.label != "DFlash":
                assert r.measured_vs_chain.n == 10 and 0 <= r.measured_vs_chain.wilcoxon_p <= 1
        assert v.best_budget == "DDTree(4)" and v.verdict.startswith(f"at batch {b}")
    assert res.counterfactual and res.counterfactual[0]["label"] == "DDTree(4)"
    assert res.branching is not None and res.branching.cycles > 0
    text = str(res)
    assert "verdict: at batch 1" in text and "counterfactual from one trace" in text and "Spine(1)" in text
    d = json.loads(json.dumps(res.to_dict()))
    assert d["batches"]["2"]["shapes"][0]["label"] == "AR" and math.isfinite(d["batches"]["1"]["shapes"][1]["tau"])


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input_is_one_line_before_any_work(tiny_engines, monkeypatch):
    eng = tiny_engines["l3-h48-b5"]  # block 5: 4 slots

    def no_decode(*a, **k):
        raise AssertionError("a decode ran before the input was checked")

    monkeypatch.setattr(measure, "decode_unit", no_decode)
    with pytest.raises(ValueError, match="9 prompts give 9 paired values; a paired test needs at least 10: give 1 more"):
        pays_off(None, PROMPTS[:9])  # refused before any model loads (engine=None would load the embedded pair)
    with pytest.raises(ValueError, match=r"DDTree\(8, width=1\) asks for 8 nodes but this drafter's block drafts 4 "
                                         r"slots, where that shape holds at most 4: use a budget <= 4"):
        pays_off(eng, PROMPTS, policies=[wb.DDTree(8, width=1)], progress=False)
    with pytest.raises(ValueError, match="batch 100000000 cannot be held: .* GiB free"):
        pays_off(eng, PROMPTS, batch=(1, 10**8), progress=False)
    with pytest.raises(ValueError, match="each batch size must be a positive integer"):
        parse_batches("1,0")
    with pytest.raises(ValueError, match="batch size 8 is given twice"):
        parse_batches("8,8")


@pytest.mark.parametrize("argv, line", [
    (["pays-off", "--limit", "5"], "--limit 5: a paired test needs at least 10 prompts"),
    (["pays-off", "--batch", "1,x"], "each batch size must be a positive integer, e.g. 1,8"),
    (["pays-off", "--prompts", "/nonexistent.jsonl"], "does not exist"),
    (["pays-off", "--target", "hybrid", "--draft", "x"], "embedded pair with its own drafter: drop --draft"),
    (["pays-off", "--policies", "ddtree:32:1", "--quiet"], "use a budget <= 15"),
])
def test_cli_bad_input(capsys, argv, line):
    from workbench.__main__ import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert line in err and "\n" not in err


def test_the_verdict_counts_a_budget_only_where_the_paired_test_separates_it():
    from workbench.analysis.paired import PairedRatio
    from workbench.payoff.verdict import ShapeRow, verdict_line

    def row(label, median, p):
        return ShapeRow(label, "tree", 3.0, 3.0, 1 / 3, {}, 10,
                        measured_vs_chain=PairedRatio(label, "DFlash", (median,) * 10, p, p))

    head, _ = verdict_line(8, [row("DDTree(4)", 1.51, 0.064), row("DDTree(8)", 1.50, 0.002)], "DFlash")
    assert head.startswith("at batch 8 DDTree pays off over DFlash: DDTree(8) 1.50x")  # the separated one
    head, _ = verdict_line(1, [row("DDTree(8)", 0.9, 0.001), row("DDTree(16)", 0.8, 0.001)], "DFlash")
    assert "does not pay off over DFlash: every budget is slower; the best, DDTree(8) 0.90x" in head
    # p = 0.02 is below 0.05 but not below 0.05 / 5 budgets: no claim
    rows = [row(f"DDTree({n})", 1.2, 0.02) for n in (4, 8, 16, 32)] + [row("DDTree(64)", 0.7, 0.001)]
    head, _ = verdict_line(1, rows, "DFlash")
    assert "is not shown to pay off over DFlash (no budget significantly faster; slower: DDTree(64))" in head
