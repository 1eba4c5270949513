"""pays-off: shapes decoded apart and interleaved, forwards counted, what decides, and bad input."""
from __future__ import annotations

import json
import math

import pytest

import workbench as wb
from workbench.payoff import measure, pays_off
from workbench.payoff.inputs import PaysOffInputError, check_inputs, fit_to_engine, parse_batches
from workbench.payoff.tree_shapes import check_fills, default_shapes, family
from workbench.payoff.verdict import signed, what_decides

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
    # batch sizes out of order, a copy of a prompt, one comma-separated string with a width-2 DDTree
    res = pays_off(eng, PROMPTS + [PROMPTS[3]], batch=(2, 1), policies="ddtree:4,DDTree(4, width=2),spine:1",
                   max_new_tokens=10, warmup=False, progress=False)
    assert list(res.batches) == [1, 2]
    for b, v in res.batches.items():
        assert v.units == 10 and not v.lossless, v.lossless  # the copy is no unit; every greedy shape equals AR's
        ar = v.row("AR")
        assert ar.forwards_per_token == pytest.approx(1 / b)  # one forward per token per row: counted, not inferred
        for r in v.rows:
            if r.cost_vs_chain:
                assert r.predicted_vs_chain == pytest.approx(r.gain_vs_chain / r.cost_vs_chain)
                assert r.decision.predicted == pytest.approx(r.predicted_vs_chain)  # one split of one ratio
            if r.label != "DFlash":
                assert r.measured_vs_chain.n == 10 and 0 <= r.measured_vs_chain.wilcoxon_p <= 1
        assert v.best_budget in ("DDTree(4)", "DDTree(4, width=2)") and v.verdict.startswith(f"at batch {b}")
        assert "Bonferroni over 2 budgets: p<0.025" in v.verdict
        assert v.fastest and "x AR" in v.fastest and "Bonferroni over 4 shapes: p<0.0125" in v.fastest
    # batch 1 came second in the list and still gives the counterfactual; the width-2 tree is said to have none
    assert [r["label"] for r in res.counterfactual] == ["DDTree(4)"]
    assert res.not_shown[0].startswith("DDTree(4, width=2): no counterfactual row")
    assert res.branching is not None and res.branching.cycles > 0
    text = str(res)
    assert "DDTree vs DFlash: at batch 1" in text and "counterfactual from one trace" in text and "Spine(1)" in text
    assert "fastest: " in text and "note: 1 repeated prompt(s) left out (prompt-10: the same text as an " in text
    cf = res.counterfactual[0]
    assert cf["bias_points"] == pytest.approx(100 * (cf["counterfactual_gain"] - cf["end_to_end_gain"]))
    assert signed(cf["bias_points"], 1, "") in text.split("bias (points)")[1].splitlines()[1]  # points in both
    strict = json.dumps(res.to_dict(), allow_nan=False)  # no bare NaN (this tiny pair leaves rates over 0 cycles)
    d = json.loads(strict)
    assert d["batches"]["2"]["shapes"][0]["label"] == "AR" and math.isfinite(d["batches"]["1"]["shapes"][1]["tau"])
    nulls = [c for c in d["branching"]["continuation"]["by_depth"] if c["spine_top1"] is None]
    assert nulls and all(c["spine_top1_note"].startswith("no cycles to rate (spine_n=0)") for c in nulls)


def test_strict_json_writes_null_with_the_reason():
    from workbench.payoff.strict_json import strict_json

    d = strict_json({"a": float("nan"), "spine_n": 0, "spine_top1": float("nan"), "r": [1.0, float("inf")],
                     "ok": 2.5, "nested": [{"x": float("-inf")}]})
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert d["a"] is None and d["a_note"].startswith("not a number (computed from no data")
    assert d["spine_top1"] is None and d["spine_top1_note"].startswith("no cycles to rate (spine_n=0)")
    assert d["r"] == [1.0, None] and d["r_note"].startswith("null entries")
    assert d["nested"][0] == {"x": None, "x_note": "-inf (a ratio over zero) written as null"} and d["ok"] == 2.5


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
    with pytest.raises(PaysOffInputError, match="batch 100000000 with 10 distinct prompts: each window of 100000000 "
                                                "would hold 99999990 prompt"):
        pays_off(eng, PROMPTS, batch=(1, 10**8), progress=False)
    huge = check_inputs(PROMPTS, batch=1, max_new_tokens=8)
    huge.batches = (1, 10**8)  # past the window check: the memory estimate is what refuses it
    with pytest.raises(PaysOffInputError, match="batch 100000000 cannot be held: .* GiB free"):
        fit_to_engine(huge, eng)
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


# ------------------------------------------------------------------------ nothing silent: every check before a decode
class Reached(Exception):
    """Raised by the stand-in decode: every check passed and the first decode was about to run."""


@pytest.fixture
def guarded(monkeypatch):
    """No decode runs: input that passes every check reaches the stand-in and raises ``Reached``; input that
    should have been refused and was not shows up as ``Reached`` too, at once rather than after a measurement."""
    def stand_in(engine, policy, prompts, *a, **k):
        raise Reached(str(policy))

    monkeypatch.setattr(measure, "decode_unit", stand_in)


def test_a_copy_of_a_prompt_is_not_a_new_paired_unit(tiny_engines, guarded):
    eng = tiny_engines["l3-h48-b5"]
    with pytest.raises(PaysOffInputError, match=r"^10 prompts hold 1 distinct text \(a copy is not a new sample\); "
                                                r"a paired test needs at least 10 distinct prompts: give 9 more$"):
        pays_off(eng, [PROMPTS[0]] * 10, progress=False)
    inp = check_inputs(PROMPTS + PROMPTS[:2], batch=1)  # copies left out, and said so
    assert inp.texts == PROMPTS and inp.notes == [
        "2 repeated prompt(s) left out (prompt-10, prompt-11: the same text as an earlier prompt, so not a new paired "
        "unit); 10 distinct prompts measured"]
    # a window larger than the prompts would hold a prompt twice
    with pytest.raises(PaysOffInputError, match=r"^batch 12 with 10 distinct prompts: each window of 12 would hold 2 "
                                                r"prompt\(s\) twice \(a copy is not a new sample\); use a batch <= 10 "
                                                r"or give 2 more prompts$"):
        pays_off(eng, PROMPTS, batch="1,12", progress=False)
    with pytest.raises(Reached):
        pays_off(eng, PROMPTS, batch="1,10", max_new_tokens=4, progress=False)  # the largest batch they allow


def test_batch_takes_one_size_and_refuses_fractions(tiny_engines, guarded):
    eng = tiny_engines["l3-h48-b5"]
    with pytest.raises(Reached):
        pays_off(eng, PROMPTS, batch=8, max_new_tokens=4, progress=False)  # one size: once a TypeError
    assert parse_batches(8) == (8,) and parse_batches("8,1") == (1, 8) and parse_batches(["2", 1]) == (1, 2)
    with pytest.raises(PaysOffInputError, match=r"^batch=\(1, 8.5\): 8.5 is not a batch size; each batch size must "
                                                r"be a positive integer, e.g. 1,8$"):
        pays_off(eng, PROMPTS, batch=(1, 8.5), progress=False)  # once ran batch 8
    with pytest.raises(PaysOffInputError, match="True is not a batch size"):
        parse_batches((True,))
    with pytest.raises(PaysOffInputError, match="'' is not a batch size"):
        parse_batches("1,,8")


def test_policies_take_every_spelling_the_registry_takes(tiny_engines, guarded):
    from workbench.engine.policies import parse_policy, registered
    from workbench.payoff.inputs import parse_policy_list

    eng = tiny_engines["l4-h32"]  # block 8: 7 slots
    spellings = ["ar", "dflash", "ddtree:4", "ddtree:4:2", "DDTree(6, width=2)", "ddtree(budget=5, width=3)",
                 "spine:1", "Spine(siblings=3)", "eagle:2:3:8", "EagleTree(2, 3, 6)",
                 "EagleTree(topk=2, steps=2, num_draft_tokens=5)"]
    for s in spellings:  # each with every other option, on the pair: no decode
        want = parse_policy(s)
        shapes = fit_to_engine(check_inputs(PROMPTS, batch=(1, 2), policies=f"{s},ddtree:3:3", max_new_tokens=8), eng)
        assert [x.label for x in shapes][-2:] == [str(want), "DDTree(3, width=3)"] or str(want) in ("AR", "DFlash")
    for cls in registered().values():  # every registered policy's own label and repr
        try:
            p = cls()
        except (TypeError, ValueError):  # no defaults for every field (a TreePolicy needs its function)
            continue
        for s in (str(p), repr(p)):
            assert parse_policy_list(s) == [p] and parse_policy_list(f"{s},ddtree:3:3") == [p, wb.DDTree(3, width=3)]
    with pytest.raises(Reached):
        pays_off(eng, PROMPTS, policies="ddtree:4", max_new_tokens=4, progress=False)  # once 'unknown policy d'
    with pytest.raises(Reached):
        pays_off(eng, PROMPTS, policies=wb.DDTree(4), max_new_tokens=4, progress=False)


def test_policy_lists_refuse_what_they_once_skipped(tiny_engines, guarded):
    eng = tiny_engines["l3-h48-b5"]  # block 5: 4 slots
    with pytest.raises(PaysOffInputError, match=r"^policies='' names no policy; give e.g. 'dflash,ddtree:8', or "
                                                r"leave it out for the default set$"):
        pays_off(eng, PROMPTS, policies="", progress=False)  # once: the default set
    with pytest.raises(PaysOffInputError, match=r"^policies='dflash,,ddtree:4': entry 2 is empty; remove the extra "
                                                r"comma$"):
        pays_off(eng, PROMPTS, policies="dflash,,ddtree:4", progress=False)  # once: skipped
    with pytest.raises(PaysOffInputError, match=r"DDTree\(4\) is listed twice"):
        pays_off(eng, PROMPTS, policies="ddtree:4,DDTree(4)", progress=False)
    with pytest.raises(PaysOffInputError, match=r"^EagleTree\(2, 9, 8\) has steps=9 but this drafter drafts 4 slots "
                                                r"per cycle; use steps <= 4$"):
        pays_off(eng, PROMPTS, policies="eagle:2:9:8", progress=False)  # once: at the first decode


@pytest.mark.parametrize("n", [1, 2])
def test_too_few_new_tokens_for_a_drafted_cycle_are_refused(tiny_engines, guarded, n):
    with pytest.raises(PaysOffInputError, match=rf"^max_new_tokens={n} leaves no drafted cycle \(the prefill commits "
                                                r"the first token, and a cycle drafts only while 2 or more remain\): "
                                                r"use max_new_tokens >= 3$"):
        pays_off(tiny_engines["l3-h48-b5"], PROMPTS, max_new_tokens=n, progress=False)  # once: after every decode
    with pytest.raises(Reached):
        pays_off(tiny_engines["l3-h48-b5"], PROMPTS, max_new_tokens=3, progress=False)


def long_split_size() -> int:
    from workbench.shipped import eval_prompts

    return len(eval_prompts("long"))


@pytest.mark.parametrize("argv, line", [
    (["pays-off", "--policies", ""], "policies='' names no policy"),
    (["pays-off", "--policies", "dflash,,ddtree:8"], "policies='dflash,,ddtree:8': entry 2 is empty"),
    (["pays-off", "--max-new-tokens", "2"], "use max_new_tokens >= 3"),
    (["pays-off", "--batch", "1,8.5"], "'8.5' is not a batch size"),
    (["pays-off", "--limit", "10", "--batch", "1,12"], "batch 12 with 10 distinct prompts"),
    (["pays-off", "--limit", "1000"], f"--limit 1000 but the long split holds {long_split_size()} prompts: use "
                                      f"--limit {long_split_size()} or less"),
])
def test_cli_refuses_before_any_decode(capsys, guarded, argv, line):
    from workbench.__main__ import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert line in err and "\n" not in err


def test_a_txt_file_of_json_lines_is_refused_with_the_name_to_give_it(tmp_path, capsys, guarded):
    from workbench.__main__ import main

    f = tmp_path / "prompts.txt"
    f.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    assert main(["pays-off", "--prompts", str(f)]) == 2  # once: each JSON line decoded as a prompt text
    assert capsys.readouterr().err.strip().endswith(
        f"prompts file '{f}' holds JSON lines, but a .txt file is read as one prompt per line (each line's JSON "
        f"would be a prompt): rename it '{tmp_path / 'prompts.jsonl'}'")


def test_the_verdict_and_the_table_each_say_their_rule():
    from workbench.analysis.paired import PairedRatio
    from workbench.payoff.tables import batch_tables
    from workbench.payoff.verdict import BatchVerdict, ShapeRow, verdict_line

    ms = dict.fromkeys(["draft", "tree", "verify", "accept", "commit", "host", "total"], 1.0)

    def row(label, median, p, family="tree"):
        return ShapeRow(label, family, 3.0, 3.0, 1 / 3, ms, 10,
                        measured_vs_chain=PairedRatio(label, "DFlash", (median,) * 10, p, p) if median else None)

    trees = [row(f"DDTree({n})", 1.2, 0.037) for n in (4, 8, 16, 32)]
    v = BatchVerdict(1, 10, [row("DFlash", None, None, "chain"), *trees])
    v.verdict, v.decides = verdict_line(1, trees, "DFlash")
    text = batch_tables(v)
    # the table orders each row at p < 0.05; the verdict, over 4 budgets at once, at p < 0.0125: both say so
    assert "DDTree(8) > DFlash" in text and "order (p<0.05, uncorrected)" in text
    assert "DDTree is not shown to pay off" in v.verdict and v.verdict.endswith(
        "10 paired units; Bonferroni over 4 budgets: p<0.0125)")


def test_without_a_ddtree_budget_the_verdict_says_why(tiny_engines):
    from workbench.payoff import spine_share
    from workbench.payoff.tree_shapes import shapes_of
    from workbench.payoff.verdict import BatchVerdict, ShapeRow, verdict_line

    head, why = verdict_line(1, [], "DFlash")  # eagle:4:5:64 or spine:1 alone: once no verdict and no reason
    assert head == ("at batch 1 no verdict on DDTree: no DDTree budget among the policies (the verdict compares DDTree "
                    "budgets against DFlash); add ddtree:N, e.g. ddtree:8") and why == ""
    shapes = shapes_of(["spine:1"], 15, 4096)
    rows = [ShapeRow(s.label, s.family, 2.0, 2.0, 0.5, {}, 10) for s in shapes]
    assert spine_share(BatchVerdict(1, 10, rows), shapes) == (None, [
        "no spine comparison: it measures a spine against the best DDTree's tokens-per-forward gain, and no DDTree "
        "budget was among the policies; add ddtree:N"])


def test_the_verdict_names_the_fastest_policy_ar_included():
    """DDTree(8) 1.46x DFlash at batch 8 while AR runs 1.76x DFlash: the verdict says AR is fastest."""
    from workbench.analysis.paired import PairedRatio
    from workbench.payoff.verdict import ShapeRow, fastest_line

    def row(label, median, p, family="tree"):
        return ShapeRow(label, family, 3.0, 3.0, 1 / 3, {}, 10,
                        measured_vs_ar=PairedRatio(label, "AR", (median,) * 10, p, p) if median else None)

    ar = row("AR", None, None, "ar")
    line = fastest_line(8, [ar, row("DFlash", 0.57, 0.002, "chain"), row("DDTree(8)", 0.83, 0.002)])
    assert line.startswith("at batch 8 no speculative shape beats AR here: AR is the fastest measured; the best of "
                           "the rest, DDTree(8) 0.83x AR (") and line.endswith("Bonferroni over 2 shapes: p<0.025)")
    line = fastest_line(1, [ar, row("DFlash", 1.2, 0.002, "chain"), row("DDTree(16)", 1.52, 0.002)])
    assert line.startswith("fastest at batch 1 (the highest median against AR, and separated from it): DDTree(16) "
                           "1.52x AR (")
    line = fastest_line(1, [ar, row("DFlash", 0.9, 0.3, "chain"), row("DDTree(16)", 1.1, 0.2)])
    assert line.startswith("at batch 1 no speculative shape is shown faster than AR (the fastest is not separated "
                           "from AR): the best median, DDTree(16) 1.10x AR")
    assert [s.label for s in default_shapes(15, 4096)][0] == "AR"  # AR is in the default set, so always measured


def test_notebook_11_states_the_rules_its_verdicts_use():
    from pathlib import Path

    src = " ".join((Path(__file__).parents[2] / "notebooks" / "11_does_ddtree_pay_off.py").read_text()
                   .replace("#", " ").split())
    assert "no order is claimed where p >= 0.05" not in src  # its verdicts use p < 0.025 (two budgets)
    assert "Bonferroni" in src and "p < 0.025" in src


# ------------------------------------------------------------------------- the calibrated policies side by side
CALIBRATED_LABELS = ["PathTree(16)", "CostTree(64)", "CutTree(16)", "PairTree(16)", "PairChain(8)", "CondTree(16)",
                     "CondChain(8)"]
LEARNED_LABELS = CALIBRATED_LABELS[-2:]  # the learned head's: they run where a head was trained on the pair


def test_the_default_set_holds_one_size_of_each_calibrated_policy_in_its_own_family():
    import argparse

    from workbench.payoff.command import add_parser
    from workbench.payoff.tree_shapes import CALIBRATED_FAMILIES, SHAPE_FAMILIES

    shapes = default_shapes(15, 4096)
    fams = {s.label: s.family for s in shapes}
    assert [s.label for s in shapes][-7:] == CALIBRATED_LABELS  # one size each: seven decodes more per unit, not 35
    assert [fams[x] for x in CALIBRATED_LABELS] == list(CALIBRATED_FAMILIES)
    assert "other" not in fams.values() and set(fams.values()) <= set(SHAPE_FAMILIES)
    assert family(wb.CutTree(8, width=1)) == "cut-tree" and family(wb.PathTree(64)) == "path-tree"
    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    said = " ".join(sub.choices["pays-off"].format_help().split())
    assert ("one size of each calibrated policy per batch size (path, costed, cut, pairtree, condtree: the size with "
            "the most replayed tokens per predicted ms on calibration prompts, never the measured ones; pairchain:8, "
            "condchain:8)") in said


def test_a_calibration_made_on_another_pair_is_refused_before_any_decode(tiny_engines, engine, guarded):
    eng = tiny_engines["l4-h32"]  # a pair nobody calibrated
    made = "make one with python -m workbench.calibrate --target DIR --draft DIR --out FILE"
    with pytest.raises(PaysOffInputError, match=rf"^PathTree\(8\): no shipped calibration was made on this pair "
                                                rf"\(vocabulary 64, block size 8\); {made} and pass calibration=FILE$"):
        pays_off(eng, PROMPTS, policies="dflash,path:8", progress=False)
    with pytest.raises(PaysOffInputError, match=r"^calibration \S+calibration.json was made on another pair: its "
                                                r"vocabulary size is 4096, this pair's 64; make one for this pair"):
        pays_off(eng, PROMPTS, policies="PairChain(4, calibration=dense)", progress=False)
    with pytest.raises(PaysOffInputError, match=r"^calibration \S+hybrid/calibration.json was made on another pair"):
        pays_off(engine, PROMPTS, policies="PathTree(16, calibration=hybrid)", progress=False)  # the other embedded pair
    # the default set runs on any pair: there the calibrated policies are left out, in one note saying why
    inp = check_inputs(PROMPTS, batch=1, max_new_tokens=4)
    labels = [s.label for s in fit_to_engine(inp, eng)]
    assert not set(CALIBRATED_LABELS) & set(labels) and "DDTree(8)" in labels
    assert inp.notes == [f"{', '.join(CALIBRATED_LABELS[:5])} left out of the default set: no shipped calibration was "
                         f"made on this pair (vocabulary 64, block size 8); {made} and pass calibration=FILE",
                         f"{', '.join(LEARNED_LABELS)} left out of the default set: no shipped conditioned head was "
                         "trained on this pair (vocabulary 64, block size 8); train one with python -m "
                         "workbench.train.cond_head --target dense --out FILE and pass head=FILE"]
    with pytest.raises(Reached):
        pays_off(eng, PROMPTS, max_new_tokens=4, progress=False)


def test_both_embedded_pairs_run_every_calibrated_policy_by_default(engine, guarded):
    for eng in (engine, wb.load("hybrid")):
        inp = check_inputs(PROMPTS, batch=(1, 8), max_new_tokens=4)
        shapes = {s.label: s.policy for s in fit_to_engine(inp, eng)}
        assert set(CALIBRATED_LABELS) <= set(shapes) and inp.notes == []
        for label in CALIBRATED_LABELS:  # bound to the pair's own calibration, and still equal to the unbound policy
            p = shapes[label]
            bound = p.head_data().meta if label in LEARNED_LABELS else p.calibration_data().__dict__
            assert p == wb.parse_policy(label) and bound["pair"]["vocab"] == eng.models.target.config.vocab_size


def test_a_pair_without_its_head_file_leaves_the_learned_policies_out_in_one_line(engine, monkeypatch, tmp_path):
    from workbench.engine.policies import cond_head

    monkeypatch.setattr(cond_head, "SHIPPED", {"dense": tmp_path / "cond_head.npz"})  # the asset is missing
    inp = check_inputs(PROMPTS, batch=(1, 8), max_new_tokens=4)
    labels = [s.label for s in fit_to_engine(inp, engine)]
    assert not set(LEARNED_LABELS) & set(labels) and set(CALIBRATED_LABELS[:5]) <= set(labels)
    assert inp.notes == [f"{', '.join(LEARNED_LABELS)} left out of the default set: no shipped conditioned head was "
                         "trained on this pair (vocabulary 4096, block size 16); train one with python -m "
                         "workbench.train.cond_head --target dense --out FILE and pass head=FILE"]
    with pytest.raises(PaysOffInputError, match=r"^CondTree\(8\): no shipped conditioned head was trained on this pair"):
        fit_to_engine(check_inputs(PROMPTS, batch=1, policies="dflash,condtree:8", max_new_tokens=4), engine)


def stand_in_run(tokens_per_forward: float, tokens_per_s: float, verify_ms: float, rest_ms: float) -> measure.UnitRun:
    """A unit's decode with the counts and times given: 10 forwards, 3 steps of the given stage times."""
    tokens = round(10 * tokens_per_forward)
    step = {**dict.fromkeys(("tree_build", "tree_compile", "accept", "record", "other"), 0.0),
            "draft": rest_ms / 2e3, "verify": verify_ms / 1e3, "commit": rest_ms / 2e3}
    return measure.UnitRun(tokens, 10, 10, tokens, tokens / tokens_per_s, 1.0, [step] * 3, [[1]])


# label -> tokens per forward, tokens/s on unit 0, verify ms, the rest of the step in ms; unit i runs (1 + i / 10)x
# as fast for every shape, so each ratio is the same on every unit
SPEC = {"AR": (1.0, 90.0, 6.0, 4.0), "DFlash": (3.0, 100.0, 10.0, 10.0), "DDTree(8)": (3.3, 110.0, 10.0, 10.0),
        "DDTree(16)": (3.6, 120.0, 11.0, 10.0),
        "PathTree(16)": (4.0, 156.0, 11.0, 10.0),  # 1.30x the best budget, by acceptance at the same step
        "PairChain(8)": (3.8, 96.0, 16.0, 10.0),  # 0.80x: more tokens per forward, but a verify 5 ms wider
        "CutTree(16)": (3.6, 120.0, 11.0, 14.0)}  # 1.05x and 0.95x on alternate units: not separated


def stand_in(engine, policy, prompts, max_new_tokens, temperature, seed, record_topk=1):
    """decode_unit's stand-in at batch 1: the unit's figures from ``SPEC`` (the unit is the prompt's index)."""
    tpf, tps, verify, rest = SPEC[str(policy)]
    i = PROMPTS.index(prompts[0])
    wobble = (1.05 if i % 2 else 0.95) if str(policy) == "CutTree(16)" else 1.0
    return stand_in_run(tpf, tps * (1 + i / 10) * wobble, verify, rest), []


def test_each_calibrated_policy_is_compared_with_the_best_ddtree_budget(engine, monkeypatch):
    from workbench.payoff.strict_json import strict_json

    seen = []

    def decode(engine, policy, prompts, *a, **k):
        seen.append(policy)
        return stand_in(engine, policy, prompts, *a, **k)

    monkeypatch.setattr(measure, "decode_unit", decode)
    # sampled: no greedy branching pass, so every decode is the stand-in's; units in order, shapes rotated per unit
    res = pays_off(engine, PROMPTS, batch=1, policies=list(SPEC), max_new_tokens=8, temperature=0.5, warmup=False,
                   progress=False)
    assert all("_bound" in p.__dict__ for p in seen if str(p) in ("PathTree(16)", "PairChain(8)", "CutTree(16)"))
    v = res.batches[1]
    assert v.best_budget == "DDTree(16)"
    got = {c.label: c for c in v.versus_best}
    assert list(got) == ["PathTree(16)", "PairChain(8)", "CutTree(16)"]  # the calibrated ones, no other shape
    path, chain, cut = got["PathTree(16)"], got["PairChain(8)"], got["CutTree(16)"]
    assert path.line == ("PathTree(16) 1.30x DDTree(16) (IQR 1.30-1.30, worst 1.30, Wilcoxon p=0.002, sign p=0.002, "
                         "10 paired units; Bonferroni over 3 calibrated policies: p<0.0167): faster than DDTree(16)")
    assert path.decision.factor == "acceptance" and path.decision.gain == pytest.approx(4.0 / 3.6)
    assert chain.outcome == "slower" and chain.measured.median == pytest.approx(0.8)
    assert chain.decision.factor == "verify width" and chain.decision.verify_share == pytest.approx(5 / 21)
    assert cut.outcome == "not separated" and cut.line.endswith(": not separated from DDTree(16)")
    assert cut.decision.factor == "acceptance"  # no tokens-per-forward gain: nothing could pay for its longer step
    text = str(res)
    assert "calibrated policies against the best DDTree budget, DDTree(16) (paired per unit):\n  PathTree(16) 1.30x" \
        in text
    assert ("    verify width decides: PairChain(8) commits 1.06x the tokens per forward of DDTree(16) while its "
            "verify costs +24% and the rest of its step 0% of DDTree(16)'s step time (predicted 0.85x, measured 0.80x)"
            ) in text
    assert "CutTree(16)'s" not in text and "decides: CutTree(16)" not in text  # not separated: nothing decides
    d = json.loads(json.dumps(strict_json(res.to_dict()), allow_nan=False))["batches"]["1"]["versus_best"]
    assert [(c["label"], c["outcome"], c["decides"]) for c in d] == [
        ("PathTree(16)", "faster", "acceptance"), ("PairChain(8)", "slower", "verify width"),
        ("CutTree(16)", "not separated", None)]
    assert d[0]["measured"]["wilcoxon_p"] < 0.0167 and d[0]["rule"] == "Bonferroni over 3 calibrated policies: p<0.0167"


def test_without_a_ddtree_budget_the_calibrated_policies_say_why(engine, monkeypatch):
    monkeypatch.setattr(measure, "decode_unit", stand_in)
    res = pays_off(engine, PROMPTS, batch=1, policies="path:16", max_new_tokens=8, temperature=0.5, warmup=False,
                   progress=False)
    v = res.batches[1]
    assert v.versus_best == [] and v.versus_best_note == (
        "at batch 1 no calibrated policy is compared with DDTree: no DDTree budget among the policies (they are "
        "compared with the best one); add ddtree:N, e.g. ddtree:8")
    assert v.versus_best_note in str(res)


def test_notebook_12_counts_tokens_and_leaves_speed_to_pays_off():
    """Notebook 12 draws no timing conclusion: its code reads no time, and it points to pays-off for speed."""
    from pathlib import Path

    from shared_checks import load_script

    root = Path(__file__).parents[2]
    build = load_script(root / "notebooks" / "build.py", "nb_build_12")
    cells = build.source_cells(root / "notebooks" / "12_trees_for_branch_agnostic_drafters.py")
    code = "\n".join(c.source for c in cells if c.cell_type == "code")
    said = " ".join(" ".join(c.source for c in cells if c.cell_type == "markdown").replace("#", " ").split())
    for timing in (".seconds", "tokens_per_s", "stage_seconds", ".wall", "perf_counter", "step_ms"):
        assert timing not in code, timing
    assert "python -m workbench pays-off" in said and "tokens per target forward" in said
    for label in CALIBRATED_LABELS + ["DDTree(16)", "DFlash()"]:  # each fix beside DDTree and DFlash
        assert f"wb.{label}" in code, label
