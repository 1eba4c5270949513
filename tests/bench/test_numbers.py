"""Numbers that read right: aligned tables at any width, every column defined,
spread and contradictions shown, budget_needed honest about what it cannot see."""
from __future__ import annotations

import re

import numpy as np

from workbench.analysis.budget import BudgetNeeded
from workbench.bench.kernel_bench import kernel_table
from workbench.bench.policy_bench import percentile_table, summary_table
from workbench.records.cycle import STAGES
from workbench.records.texttable import text_table


def _pct(x):
    return {"p50": x, "p90": 2 * x, "max": 30 * x}


def fake_summary(scale: float) -> dict:
    s = {
        "tau": 2.5, "tokens_per_s": 123.4, "tokens_per_s_range": [100.0, 140.0], "speedup_vs_ar": 1.2,
        "speedup_vs_dflash": 1.1, "accept_rate": 0.4, "decode_speedup_vs_ar": 1.3, "ceiling_speedup": 2.0,
        "ceiling_ratio": 0.65, "lossless": True,
        "stage_seconds_per_cycle": {st: 0.001 * scale for st in STAGES},
        "stage_percentiles": {st: _pct(0.001 * scale) for st in ["cycle", *STAGES]},
        "outside_cycles": {"setup": 0.01, "prefill": 0.02 * scale, "first_cycle": 0.03, "between_cycles": 0.0},
    }
    return {"AR": dict(s, accept_rate=None), "DDTree(16, width=2)": s}


def test_percentile_table_never_runs_columns_together():
    for scale in (0.1, 1.0, 100.0, 10_000.0):  # values from 0.10 ms to 30 s
        t = percentile_table(fake_summary(scale))
        rows = [ln for ln in t.splitlines() if ln.startswith(("AR", "DDTree"))]
        for ln in rows:
            cells = re.findall(r"\d+\.\d+/\d+\.\d+/\d+\.\d+", ln)
            assert len(cells) == 1 + len(STAGES), ln  # each p50/p90/max triple stands alone
        head = t.splitlines()[1]
        ends = {len(ln.rstrip()) for ln in [head, *rows]}
        assert len(ends) == 1, (scale, t)  # right-aligned last column: one right edge


def test_summary_table_defines_every_column_and_labels_means():
    t = summary_table(fake_summary(1.0))
    lines = t.splitlines()
    names = re.split(r"\s{2,}", lines[0].strip())
    defined = set()
    for ln in lines[3:]:  # legend: '  name[, name]  definition'
        defined |= set(re.split(r", ", re.split(r"\s{2,}", ln.strip())[0]))
    for n in names[1:]:
        assert n in defined or (n in ("draft", "tree", "verify", "accept", "commit") and "draft .. commit" in defined), n
    assert "accept" in names and "acc/drafted" in names  # the rate and the stage have names of their own
    assert "MEAN ms per cycle" in t


def test_text_table_aligns_any_width():
    t = text_table(["a", "bb"], [["x", "1"], ["yyyyyy", "123456789"]])
    lines = t.splitlines()
    assert len({len(ln) for ln in lines}) == 1 and lines[2].endswith("123456789")


def kernel_res(build, both):
    row = {"budget": 16, "vectorized_s": build, "vectorized_range_s": [build / 2, build * 2], "heap_s": 2e-4,
           "heap_range_s": [1e-4, 3e-4], "heap_over_vectorized": 2e-4 / build, "build_compile_s": both,
           "build_compile_range_s": [both, both]}
    if both < build:
        row["contradiction"] = "build+compile < build alone"
    return {"device": "cpu", "threads": 2, "logprobs_shape": [1, 15, 4096], "repeats": 10, "tree_build": [row],
            "accept": [{"budget": 16, "nodes": 17, "torch_s": 1e-4, "torch_range_s": [1e-4, 2e-4], "sglang_s": None,
                        "sglang_error": "no"}],
            "kv_compact": [{"budget": 16, "accepted": 3, "compact_kv_s": 1e-4, "compact_kv_range_s": [1e-4, 1e-4],
                            "loop_s": 2e-4, "loop_range_s": [2e-4, 2e-4], "loop_over_compact": 2.0}]}


def test_kernel_table_shows_spread_and_flags_contradictions():
    ok = kernel_table(kernel_res(3e-4, 5e-4))
    assert "150-600" in ok and "range" in ok and "! budget" not in ok
    bad = kernel_table(kernel_res(7995e-6, 283e-6))
    assert "! budget 16" in bad


def test_kernel_bench_records_the_contradiction(monkeypatch):
    import workbench.bench.kernel_bench as bm

    calls = iter(range(10_000))

    def fake_times(fn, repeats, device):  # build alone measured slow, build + compile fast
        k = next(calls) % 5
        return [{0: 8e-3, 1: 1e-4, 2: 3e-4}.get(k, 1e-4)] * repeats

    monkeypatch.setattr(bm, "_times", fake_times)
    res = bm.time_kernels([4], repeats=2, backends=("torch",))
    assert "contradiction" in res["tree_build"][0]
    assert res["tree_build"][0]["vectorized_range_s"] == [8e-3, 8e-3]


def test_budget_needed_says_what_it_cannot_see():
    ranks = np.array([[1.0, np.inf, np.nan], [1.0, np.inf, np.inf], [2.0, 5.0, np.nan]])
    bn = BudgetNeeded(ranks, np.array([2, 3, 1]), max_budget=8, record_topk=8, policy="DDTree(32)")
    text = str(bn)
    assert "inf" not in text
    assert "more than 8 nodes" in text and "2 of 3 accepted paths" in text and "record_topk" in text


def test_stepper_width_control_and_steady_rate(tiny_engines):
    import workbench as wb
    from workbench.views import Stepper

    s = tiny_engines["l4-h32"].session("t1 t2", policy=wb.DDTree(8, width=2), max_new_tokens=40)
    st = Stepper(s)
    assert st.width.value == 2  # a width set in code is shown ...
    st.budget.value = 12
    assert s.policy == wb.DDTree(12, width=2)  # ... and kept when the user types a budget
    st.width.value = 0
    assert s.policy == wb.DDTree(12)  # the user can lift it
    st.width.value = 1
    assert st.step().policy == "DDTree(12, width=1)"
    assert "needs two cycles" in st.stats.value
    st.run(3)
    assert "steady:" in st.stats.value and "cold, left out" in st.stats.value
    s.policy = wb.DFlash()
    st.step()
    assert st.width.disabled and st.budget.disabled


def test_tree_labels_of_whitespace_runs_are_short():
    from workbench.views.figures import short_label, visible

    assert short_label(" " * 16) == "␣×16"
    assert short_label("\n\n") == "⏎⏎" and short_label("\n\n\n") == "⏎×3"
    assert short_label("    return") == "␣×4return"
    assert len(short_label("x" * 40)) == 10 and short_label("x" * 40).endswith("…")
    assert short_label("<b>") == "&lt;b&gt;" and visible(" " * 16) == "␣" * 16  # hovers keep the full text


def test_tree_figure_uses_short_labels_and_token_strip_fits(tiny_engines):
    import workbench as wb
    from workbench.views.figures import token_stream, tree_figure

    eng = tiny_engines["l4-h32"]
    t = eng.generate("t1 t2", wb.DDTree(8), max_new_tokens=12)

    class Spaces:  # every token decodes to a long run of spaces
        def decode(self, ids):
            return " " * 16

        def convert_ids_to_tokens(self, i):
            return "x"

    fig = tree_figure(t.cycles[0], Spaces())
    texts = [x for tr in fig.data for x in (tr.text or ())]
    assert texts and all(x == "␣×16" for x in texts)
    assert any("␣" * 16 in h for tr in fig.data for h in (tr.hovertext or ()))
    strip = token_stream(t, Spaces(), width=16, rows_in_view=2)
    bar = next(tr.colorbar for tr in strip.data if tr.showscale)
    assert bar.dtick >= 1 and bar.tickmode == "linear" and "<br>" not in bar.title.text
    assert "<br><sup>rows 1-2" in strip.layout.title.text


def test_order_verdict_claims_only_what_the_spread_holds():
    from workbench.analysis import order_values

    ar = [1.0] * 12
    dd = [1.7 + 0.01 * i for i in range(12)]
    clear = order_values({"AR": ar, "DDTree(16)": dd, "DFlash": [1.2 + 0.01 * i for i in range(12)]}, "x")
    assert clear.holds and clear.order == ["DDTree(16)", "DFlash", "AR"]
    assert "order holds" in str(clear) and "DDTree(16) > DFlash > AR" in str(clear)
    noisy = order_values({"AR": [1.0, 1.0], "DDTree(16)": [1.8, 0.4]}, "x")  # 1.80x on one prompt, 0.40x on another
    assert not noisy.holds and "too noisy" in str(noisy) and noisy.overlapping == [("DDTree(16)", "AR")]
    one = order_values({"AR": [1.0], "DDTree(16)": [1.8]}, "x")
    assert not one.holds and "no order is claimed" in str(one)
    # Ranges overlap (1.11-1.20 vs 1.0-1.25), yet DDTree wins every one of 12 pairs.
    base = [1.0, 1.05, 1.1, 1.25, 1.0, 1.02, 1.08, 1.2, 1.01, 1.04, 1.12, 1.06]
    paired = order_values({"DFlash": base, "DDTree(16)": [b * (1.11 + 0.008 * i) for i, b in enumerate(base)]}, "x")
    assert min(paired.values["DDTree(16)"]) < max(base) and paired.holds
    assert paired.p_values["DDTree(16)", "DFlash"] < 0.01
    # a coin flip per pair is not an order, whatever the medians say
    flip = order_values({"A": [1.0] * 12, "B": [1.3 if i % 2 else 0.8 for i in range(12)]}, "x")
    assert not flip.holds and flip.overlapping


def test_bench_summary_gives_speedups_per_repeat(tiny_engines):
    import workbench as wb
    from workbench.analysis import order_verdict
    from workbench.bench.policy_bench import compare_policies

    res = compare_policies(tiny_engines["l4-h32"], [wb.AR(), wb.DDTree(4)], [{"id": "a", "prompt": "t1 t2 t3"}],
                           max_new_tokens=8, repeats=3, progress=False, warmup=False)
    s = res.summary
    assert s["AR"]["speedup_vs_ar_per_repeat"] == [1.0, 1.0, 1.0]
    assert len(s["DDTree(4)"]["speedup_vs_ar_per_repeat"]) == 3
    v = order_verdict(s)
    assert v.repeats == 3 and set(v.order) == {"AR", "DDTree(4)"}
    assert ("order holds" in str(v)) == v.holds


def test_run_and_kernels_json_carry_settings_and_versions(capsys, tiny_pairs):
    import json

    from workbench.__main__ import main

    t, d = tiny_pairs["l4-h32"]
    assert main(["run", "--prompt", "t1 t2", "--policy", "ddtree:4", "--max-new-tokens", "4", "--json",
                 "--target", str(t), "--draft", str(d), "--threads", "1"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert (obj["device"], obj["dtype"], obj["threads"], obj["max_new_tokens"]) == ("cpu", "float32", 1, 4)
    assert obj["versions"]["torch"] and obj["seed"] == 0
    assert main(["kernels", "--budgets", "4", "--repeats", "1", "--json", "--quiet"]) == 0
    k = json.loads(capsys.readouterr().out)
    assert k["versions"]["workbench"] and "vectorized_range_s" in k["tree_build"][0]
