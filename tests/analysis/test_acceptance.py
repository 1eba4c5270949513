"""Acceptance as the ecosystem reports it: per request in AIPerf's record shape, pooled as
``vllm bench serve`` writes it, in vLLM's and SGLang's per-request names, from a trace, a dump and vLLM's counters.
Hand-made traces with known accepted counts give the exact histogram and means; a dump gives what its traces give."""
from __future__ import annotations

import json

import pytest
import torch

import workbench as wb
from workbench.analysis.acceptance import AcceptanceError, acceptance, from_trace, from_vllm_counters
from workbench.records.cycle import Cycle, Trace

AIPERF_FIELDS = ["engine", "mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram",
                 "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_steps", "num_spec_tokens",
                 "completion_tokens", "per_step_accepted", "per_step_drafted"]  # SpecDecodeAcceptanceRecord's, in order


def cycle(index: int, parents: list[int], path: list[int], slots: int = 15) -> Cycle:
    """A cycle over the tree ``parents`` (root at 0) whose accepted path is ``path`` (root first); ``slots``
    drafted slots in the drafter's block."""
    n = len(parents)
    par = torch.tensor(parents)
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    tokens = torch.arange(100, 100 + n)
    ar = torch.arange(n)
    return Cycle(index=index, policy="t", start=10 + index, root_token=100,
                 draft_topk_tokens=torch.zeros(slots, 1, dtype=torch.long), draft_topk_logprobs=torch.zeros(slots, 1),
                 tokens=tokens, parents=par, depth=depth, rank=torch.zeros(n, dtype=torch.long), score=torch.zeros(n),
                 position_ids=10 + depth, visibility=torch.ones(n, n, dtype=torch.bool), retrieve_next_token=ar,
                 retrieve_next_sibling=ar, target_choice=tokens, target_prob=torch.ones(n),
                 accepted_nodes=torch.tensor(path), accepted_tokens=tokens[path], bonus=7, committed=len(path),
                 stage_seconds={}, forwards=())


def chain(index: int, accepted: int, drafts: int = 15) -> Cycle:
    return cycle(index, list(range(-1, drafts)), list(range(accepted + 1)))


def hand_trace() -> Trace:
    """DFlash-like chains of 15 drafts accepting 3, 0, 15, 2, 0, and one cycle that drafted nothing."""
    cycles = [chain(0, 3), chain(1, 0), chain(2, 15), cycle(3, [-1], [0]), chain(4, 2), chain(5, 0)]
    return Trace(meta={"policy": "DFlash"}, cycles=cycles, new_tokens=26)


def test_a_trace_with_known_accepted_counts_gives_the_exact_record():
    r = from_trace(hand_trace(), "0")
    d = r.to_dict()
    assert list(d) == AIPERF_FIELDS
    assert d["acceptance_histogram"] == {0: 2, 2: 1, 3: 1, 15: 1}  # the step that drafted nothing is not a step
    assert (d["num_spec_steps"], d["num_accepted_draft_tokens"], d["num_draft_tokens"]) == (5, 20, 75)
    assert d["mean_acceptance_length"] == 5.0 and d["draft_acceptance_rate"] == 20 / 75
    assert (d["num_spec_tokens"], d["completion_tokens"], d["engine"]) == (15, 26, "workbench")
    assert d["per_step_accepted"] == [3, 0, 15, 2, 0] and d["per_step_drafted"] == [15] * 5
    # AIPerf's invariants (its model validator): the histogram sums to the steps, its j-weighted sum to the accepted
    h = d["acceptance_histogram"]
    assert sum(h.values()) == d["num_spec_steps"] and sum(j * n for j, n in h.items()) == d["num_accepted_draft_tokens"]
    v = r.vllm()
    assert v["acceptance_histogram"] == [2, 0, 1, 1] + [0] * 11 + [1] and len(v["acceptance_histogram"]) == 16
    assert r.per_position()[:4] == [3 / 5, 3 / 5, 2 / 5, 1 / 5] and r.per_position()[-1] == 1 / 5
    s = r.sglang()
    assert s["spec_verify_ct"] == 5 and s["spec_accept_length"] == 26 / 5 and s["spec_accept_token_num"] == 20
    assert s["spec_draft_token_num"] == 75 and s["spec_accept_histogram"] == v["acceptance_histogram"]
    json.dumps(r.to_dict())  # the record is plain JSON


def test_a_tree_counts_its_accepted_depth_and_its_nodes():
    """Tree-agnostic: a 16-node tree whose path reaches depth 4 accepted 4 drafts and verified 16."""
    parents = [-1, 0, 0, 1, 1, 3, 3, 5, 5, 7, 2, 2, 10, 10, 12, 14]
    t = Trace(meta={}, cycles=[cycle(0, parents, [0, 1, 3, 5, 7]), cycle(1, parents, [0, 2])], new_tokens=8)
    r = from_trace(t, "tree")
    assert r.acceptance_histogram == {1: 1, 4: 1} and r.num_draft_tokens == 30 and r.mean_acceptance_length == 3.5


def test_several_requests_pool_as_vllm_bench_serve_writes_them():
    a = acceptance({"a": hand_trace(), "b": Trace(meta={}, cycles=[chain(0, 5), chain(1, 1)], new_tokens=9)})
    assert [r.request for r in a.records] == ["a", "b"]
    p = a.pooled()
    assert p.acceptance_histogram == {0: 2, 1: 1, 2: 1, 3: 1, 5: 1, 15: 1} and p.completion_tokens == 35
    b = a.vllm_bench_serve()
    assert b["spec_decode_num_drafts"] == 7 and b["spec_decode_accepted_tokens"] == 26
    assert b["spec_decode_draft_tokens"] == 105 and b["spec_decode_acceptance_length"] == 1 + 26 / 7
    assert b["spec_decode_acceptance_rate"] == pytest.approx(100 * 26 / 105)
    assert b["spec_decode_per_position_acceptance_rates"][:2] == [5 / 7, 4 / 7]
    text = str(a)
    assert "Acceptance length 4.71" in text and "0:2 2:1 3:1 15:1" in text
    assert acceptance([hand_trace()]).records[0].request == "0"


def test_vllm_counters_give_the_same_record():
    """The hand trace as vLLM's counters would count it: drafts, draft tokens, accepted, accepted per position."""
    ours = from_trace(hand_trace(), "0")
    per_pos = [sum(a > i for a in ours.per_step_accepted) for i in range(15)]
    theirs = from_vllm_counters({"drafts": 5.0, "draft_tokens": 75.0, "accepted": 20.0, "per_pos": per_pos},
                                request="0", completion_tokens=26)
    same = ("mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_accepted_draft_tokens",
            "num_draft_tokens", "num_spec_steps", "num_spec_tokens", "completion_tokens")
    assert {k: theirs.to_dict()[k] for k in same} == {k: ours.to_dict()[k] for k in same}
    assert theirs.engine == "vllm" and theirs.per_position() == ours.per_position()
    with pytest.raises(AcceptanceError, match="contradict each other"):
        from_vllm_counters({"drafts": 5, "draft_tokens": 75, "accepted": 20, "per_pos": [2, 3] + [0] * 13})
    with pytest.raises(AcceptanceError, match="no per-position counts"):
        from_vllm_counters({"drafts": 5, "draft_tokens": 75, "accepted": 20, "per_pos": []})
    with pytest.raises(AcceptanceError, match="need drafts, draft_tokens, accepted"):
        from_vllm_counters({"drafts": 5})


def test_a_dump_gives_what_its_traces_give(engine, tmp_path):
    from workbench.conform.dump import read_dump

    path = tmp_path / "run.dump"
    b = engine.batch_session(["def parse(line):", "class Stack:"], wb.DDTree(16), max_new_tokens=24, dump=path)
    b.run()
    from_dump = acceptance(read_dump(path))
    from_traces = acceptance({str(i): s.trace for i, s in enumerate(b.sessions)})
    assert [r.to_dict() for r in from_dump.records] == [r.to_dict() for r in from_traces.records]
    assert from_dump.records[0].num_spec_tokens == 15 and from_dump.records[0].per_step_drafted[0] == 16
    # a record without its accepted path: refused, naming the file and line
    lines = path.read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if '"kind": "cycle"' in line or '"kind":"cycle"' in line)
    rec = json.loads(lines[i])
    del rec["accepted_nodes"]
    lines[i] = json.dumps(rec)
    bad = tmp_path / "bad.dump"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(AcceptanceError, match=f"{bad}:{i + 1}: a cycle record without accepted_nodes"):
        acceptance(read_dump(bad))


@pytest.mark.parametrize("source", [None, "run.dump", [], {}, [1, 2], ({"format": "other"}, [])])
def test_what_is_not_a_trace_or_a_dump_is_one_line(source):
    with pytest.raises(AcceptanceError) as e:
        acceptance(source)
    assert "\n" not in str(e.value) and "pass a wb.Trace" in str(e.value)


def test_the_name_is_the_function_whatever_was_imported():
    import importlib

    importlib.import_module("workbench.analysis.acceptance")
    assert callable(wb.analysis.acceptance) and wb.analysis.acceptance is acceptance


def test_a_trace_without_a_cycle_is_refused():
    with pytest.raises(AcceptanceError, match="holds no cycle") as e:
        acceptance(Trace(meta={}, cycles=[], new_tokens=1))
    assert "\n" not in str(e.value)


def test_an_ar_trace_reads_one_token_a_step_per_request_and_pooled():
    ar = Trace(meta={"policy": "AR"}, cycles=[cycle(i, [-1], [0]) for i in range(5)], new_tokens=6)
    a = acceptance(ar)
    assert a.records[0].mean_acceptance_length == 1.0
    assert a.pooled().mean_acceptance_length == 1.0 and a.vllm_bench_serve()["spec_decode_acceptance_length"] == 1.0
    assert "Acceptance length 1.00" in str(a) and "0.00" not in str(a).split("\n")[-1].split("Acceptance rate")[0]
    assert "no speculative step" in str(a)


def test_a_copy_is_no_new_sample():
    t = hand_trace()
    for source in ([t, t], {"a": t, "b": hand_trace()}):
        with pytest.raises(AcceptanceError, match="a copy") as e:
            acceptance(source)
        assert "\n" not in str(e.value)
    acceptance([t, Trace(meta={}, cycles=[chain(0, 5), chain(1, 1)], new_tokens=9)])  # two runs: pooled


def test_two_pairs_are_not_pooled():
    dense = Trace(meta={"target": "workbench/assets/target", "draft": "workbench/assets/draft"},
                  cycles=[chain(0, 3)], new_tokens=5)
    hybrid = Trace(meta={"target": "workbench/assets/hybrid/target", "draft": "workbench/assets/hybrid/draft"},
                   cycles=[chain(0, 2)], new_tokens=4)
    with pytest.raises(AcceptanceError, match="one pair") as e:
        acceptance([dense, hybrid])
    assert "workbench/assets/hybrid/target" in str(e.value) and "\n" not in str(e.value)
