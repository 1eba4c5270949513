"""pays-off's refilled batch: B slots served from the prompt queue through BatchSession.admit, every prompt
decoded once, a finished row's slot taken by the next prompt at the next cycle, paired per prompt."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import workbench as wb
from workbench.payoff import pays_off
from workbench.payoff.inputs import check_inputs, fit_to_engine, refill_refusal
from workbench.payoff.refill import RefilledQueue, run_side_by_side

PROMPTS = [f"t{i} t{i + 3} t{(i * 7) % 40 + 1} t{i + 1}" for i in range(1, 11)]  # 10: the fewest pays-off takes

pytestmark = pytest.mark.usefixtures("one_thread")


def running(r, c: int) -> list[int]:
    """The prompts that ran in cycle c."""
    return [i for i in range(len(r.joined)) if r.joined[i] <= c <= r.left[i]]


# AR commits one token a cycle, so a prompt with limit L runs L - 1 cycles: rows end at cycles set by the limits
@pytest.mark.parametrize("policy, limits", [(wb.AR(), [4, 12, 7, 9, 5, 10, 6, 8, 11, 3]), (wb.DDTree(4), 10)])
def test_a_finished_rows_slot_takes_the_next_prompt_at_the_next_cycle(tiny_engines, policy, limits):
    eng, slots = tiny_engines["l4-h32"], 3
    q = RefilledQueue(eng, policy, PROMPTS, slots, limits, 0.0, 0)
    while not q.finished:
        bc = q.step()
        assert bc is None or len(bc.requests) <= slots  # never more live rows than slots
    r = q.result()
    n, cycles = len(PROMPTS), len(r.live_rows)
    # every prompt decoded once, in queue order, as one request of the one batch
    assert [s.prompt for s in q.batch.sessions] == PROMPTS and all(t > 0 for t in r.tokens)
    assert r.joined == sorted(r.joined) and r.joined[:slots] == [0] * slots
    assert [len(running(r, c)) for c in range(cycles)] == r.live_rows and max(r.live_rows) == slots
    for c in range(cycles - 1):
        started = sum(j <= c for j in r.joined)
        if started < n:
            assert r.live_rows[c] == slots  # while a prompt waits, no slot is idle
        freed = sum(x == c for x in r.left)
        assert sum(j == c + 1 for j in r.joined) == min(freed, n - started)  # refilled at the very next cycle
    if isinstance(limits, list):  # the first rows end at cycles 2, 10 and 5: their slots refilled at 3 and 6
        assert r.left[:slots] == [2, 10, 5] and r.joined[slots:5] == [3, 6]
        assert r.tokens == [n - 1 for n in limits]  # each row's cycles commit its limit, less the prefill's token
    # counted, never twice: one target forward per cycle, split over its rows; the shares add up to the run
    assert r.forwards == cycles and sum(r.forward_shares) == pytest.approx(cycles)
    assert sum(r.shares) == pytest.approx(r.seconds) and r.row_cycles == [r.left[i] - r.joined[i] + 1
                                                                           for i in range(n)]
    assert sum(r.tokens) == sum(c.committed for t in q.batch.traces for c in t.cycles)


def test_refilled_tokens_equal_the_static_batchs_per_prompt(tiny_engines):
    eng = tiny_engines["l3-h48-b5"]
    for policy in (wb.DDTree(4), wb.AR()):
        r = RefilledQueue(eng, policy, PROMPTS, 4, 8, 0.0, 0).run()
        static = []
        for w in range(0, len(PROMPTS), 4):  # the static batch: windows run to their slowest row
            b = eng.batch_session(PROMPTS[w : w + 4], policy=policy, max_new_tokens=8)
            b.run()
            static += [list(s.generated) for s in b.sessions]
        assert r.outputs == static, str(policy)


def test_admit_refuses_static_shapes(tiny_engines):
    b = tiny_engines["l4-h32"].batch_session(PROMPTS[:2], policy=wb.DDTree(4), max_new_tokens=6, static_shapes=True)
    with pytest.raises(ValueError, match=r"^admit: this batch runs with static shapes \(CUDA graphs\)"):
        b.admit(PROMPTS[2:3])


def test_queues_run_side_by_side_one_cycle_each_rotated():
    log = []

    class Queue:
        def __init__(self, name, cycles):
            self.name, self.left = name, cycles

        @property
        def finished(self):
            return self.left == 0

        def step(self):
            log.append(self.name)
            self.left -= 1

        def result(self):
            return self.name

    assert run_side_by_side([Queue("a", 2), Queue("b", 3), Queue("c", 1)]) == ["a", "b", "c"]
    assert log == ["a", "b", "c", "b", "a", "b"]  # round 2 starts at b, round 3 at c (done: b runs alone)


def test_the_verdict_at_batch_b_is_the_refilled_batchs_and_says_why(tiny_engines):
    eng = tiny_engines["l3-h48-b5"]
    res = pays_off(eng, PROMPTS, batch=(1, 2), policies="ddtree:2", max_new_tokens=6, warmup=False, progress=False)
    static, refilled = res.batches[2], res.refilled[2]
    assert (static.mode, refilled.mode) == ("static", "refilled") and res.headline(2) is refilled
    assert res.headline(1) is res.batches[1] and list(res.refilled) == [2]  # batch 1 has no batch mode
    assert static.verdict.startswith("at batch 2 (static batch) ")
    assert refilled.verdict.startswith("at batch 2 (refilled batch) ") and "10 paired units" in refilled.verdict
    assert refilled.fastest.startswith(("at batch 2 (refilled batch) ", "fastest at batch 2 (refilled batch) "))
    assert not refilled.lossless and refilled.units == 10  # every greedy shape's prompts equal AR's
    for r in refilled.rows:
        assert 1 <= r.mean_rows <= 2 and r.queue_vs_chain > 0
        if r.label != "DFlash":
            assert r.measured_vs_chain.n == 10
    assert res.verdict_mode[2]["mode"] == "refilled" and "SGLang and vLLM refill a finished row's slot" in \
        res.verdict_mode[2]["why"]
    text = str(res)
    assert "== batch 2, refilled batch: 10 paired units (the prompts of one queue served by 2 slots" in text
    assert "verdict mode at batch 2: the refilled batch's verdict is this batch size's; serving engines" in text
    d = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    assert d["refilled"]["2"]["mode"] == "refilled" and d["verdict_mode"]["2"]["mode"] == "refilled"
    assert d["batches"]["2"]["mode"] == "static" and d["refilled"]["2"]["shapes"][0]["mean_rows"] <= 2


def test_without_a_refilled_batch_the_verdict_is_the_static_ones_and_says_why(tiny_engines, monkeypatch):
    eng = tiny_engines["l3-h48-b5"]
    inp = check_inputs(PROMPTS, batch=2, max_new_tokens=4)
    shapes = fit_to_engine(inp, eng)
    assert refill_refusal(inp, eng, shapes, 2) == ""
    graphed = SimpleNamespace(graphs=object(), models=eng.models)
    assert refill_refusal(inp, graphed, shapes, 2).startswith("this engine captures CUDA graphs, whose static shapes")
    monkeypatch.setattr("workbench.payoff.inputs.refill_refusal", lambda *a: "a reason")
    res = pays_off(eng, PROMPTS, batch=2, policies="ddtree:2", max_new_tokens=4, temperature=0.5, warmup=False,
                   progress=False)
    assert res.refilled == {} and res.headline(2) is res.batches[2]
    assert res.verdict_mode[2] == {"mode": "static", "why": "the refilled batch was not measured: a reason"}
    assert "at batch 2 no refilled batch: a reason" in res.not_shown
