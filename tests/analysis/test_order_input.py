"""order_verdict reads what a user holds: res.summary, the BenchResult, or the object `bench --json`
prints (that object included: AR in it is found, not asked for)."""
from __future__ import annotations

import json

import pytest

import workbench as wb

pytestmark = pytest.mark.usefixtures("one_thread")


def test_order_verdict_reads_the_bench_json_object(tiny_engines):
    from workbench.analysis import order_verdict
    from workbench.bench.policy_bench import bench_json, compare_policies

    res = compare_policies(tiny_engines["l4-h32"], [wb.AR(), wb.DDTree(4)], [{"id": "a", "prompt": "t1 t2 t3"}],
                           max_new_tokens=6, repeats=2, progress=False, warmup=False)
    printed = json.loads(json.dumps({**bench_json(res), "reference": [{"budget": 4}], "ops_per_cycle": {}}))
    want = order_verdict(res.summary)
    for given in (printed, res):
        v = order_verdict(given)
        assert set(v.order) == {"AR", "DDTree(4)"} and v.values == want.values
    # as bench gives it without AR: no speedups
    no_ar = {"DDTree(4)": {**printed["DDTree(4)"], "speedup_vs_ar_per_prompt": None, "speedup_vs_ar_per_repeat": None}}
    with pytest.raises(ValueError, match=r"run bench with AR in the policies"):
        order_verdict(no_ar)
    with pytest.raises(TypeError, match=r"order_verdict takes a bench summary .* got list"):
        order_verdict([1, 2])
