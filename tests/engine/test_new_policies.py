"""The calibrated tree policies (PathTree, CostTree, CutTree, PairTree, PairChain): lossless on both embedded pairs
at batch 1 and 8, reachable by every spelling, refused in one line on bad calibration input (another pair's,
too thin, a head made with another tokenizer) before any decode, the per-cycle budget shrinking with the batch
under the cost model, the cut keeping fewer nodes as its threshold rises, the head's chain a Viterbi path."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import workbench as wb
from ddtree_kernels import validate_tree
from ddtree_kernels.tree_build import top_slots
from workbench.bench.policy_bench import first_difference
from workbench.engine.policies import (CostTree, CutTree, PairChain, PairTree, PathTree, from_wire, parse_policy,
                                       registered, to_wire)
from workbench.engine.policies.calibration import MIN_CYCLES, SHIPPED, CalibrationError, load
from workbench.engine.policies.cost_tree import budget_for
from workbench.engine.policies.cut_tree import kept_nodes
from workbench.engine.policies.pair_chain import best_chain
from workbench.engine.stages.draft import Draft
from workbench.records.forward import ForwardMode, ForwardRecord
from workbench.serve import wire
from shared_checks import assert_greedy_equals_ar

NEW = [PathTree(16), CostTree(32), CutTree(16), CutTree(15, width=1), CutTree(16, threshold=0.5), PairTree(16),
       PairChain(8)]


@pytest.fixture(scope="module")
def hybrid():
    return wb.load("hybrid")


# ------------------------------------------------------------------------------------------ spellings
def test_every_spelling_round_trips_and_the_registry_lists_them():
    assert {"path", "costed", "cut", "pairtree", "pairchain"} <= set(registered())
    for p in NEW + [PathTree(8, calibration="hybrid"), CutTree(4, threshold=0.25, width=2, calibration="dense")]:
        assert parse_policy(str(p)) == p and parse_policy(repr(p)) == p, p
        assert from_wire(to_wire(p)) == p
        assert wire.policy_from_wire(wire.loads(wire.dumps(wire.policy_to_wire(p)))) == p
    assert parse_policy("path:24") == PathTree(24) and parse_policy("costed:48") == CostTree(48)
    assert parse_policy("pairtree:24") == PairTree(24) and parse_policy("pairchain:4") == PairChain(4)
    assert parse_policy("cut:12:0.3") == CutTree(12, threshold=0.3) == parse_policy("CutTree(12, threshold=0.3)")
    assert "path:N" in wb.engine.policies.usages() and "cut:N:T" in wb.engine.policies.usages()
    from workbench.engine.validate import policy_list

    assert policy_list("ar,path:8,cut:8:0.2") == [wb.AR(), PathTree(8), CutTree(8, threshold=0.2)]


@pytest.mark.parametrize("bad,msg", [("cut:16:1.5", r"threshold=1.5 must be a number in \(0, 1\)"),
                                     ("cut:16:0", r"threshold=0 must be a number in \(0, 1\)"),
                                     ("CutTree(16, threshold=1)", r"threshold=1 must be"),
                                     ("path:0", "budget=0 must be an integer"),
                                     ("costed:x", "budget='x' must be an integer")])
def test_bad_settings_are_one_line(bad, msg):
    with pytest.raises(ValueError, match=msg) as e:
        parse_policy(bad)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------ lossless
def greedy_equals_ar(engine, prompts, policies, new: int, batch: bool):
    """Each solo cycle verifies at most the policy's static node count (less the root)."""
    block = engine.models.block_size
    assert_greedy_equals_ar(engine, prompts, policies, new, batch=batch,
                            node_cap=lambda policy: policy.static_nodes(block) - 1)


def test_greedy_equals_ar_dense_batch_1(engine, eval_prompts):
    greedy_equals_ar(engine, [it["prompt"] for it in eval_prompts[:2]], NEW, 32, batch=False)


@pytest.mark.slow  # a few seconds on an idle machine, minutes on a loaded one
def test_greedy_equals_ar_dense_batch_8(engine, eval_prompts):
    greedy_equals_ar(engine, [it["prompt"] for it in eval_prompts[:8]], NEW, 24, batch=True)


@pytest.mark.slow  # a few seconds on an idle machine, minutes on a loaded one
def test_greedy_equals_ar_hybrid_batch_1(hybrid, eval_prompts):
    greedy_equals_ar(hybrid, [it["prompt"] for it in eval_prompts[2:4]], NEW, 24, batch=False)


@pytest.mark.slow  # a few seconds on an idle machine, minutes on a loaded one
def test_greedy_equals_ar_hybrid_batch_8(hybrid, eval_prompts):
    greedy_equals_ar(hybrid, [it["prompt"] for it in eval_prompts[:8]], NEW, 16, batch=True)


def test_static_shapes_verify_the_whole_tree_losslessly(engine, eval_prompts):
    """Under static shapes the build never reads the device: the path tree on the device build, whole."""
    prompt = eval_prompts[0]["prompt"]
    ref = engine.session(prompt, policy=wb.AR(), max_new_tokens=24)
    ref.run()
    for policy in (PathTree(8), CostTree(8), CutTree(8)):
        s = engine.session(prompt, policy=policy, max_new_tokens=24, static_shapes=True)
        s.run()
        assert s.tokens == ref.tokens, f"{policy}: differs at {first_difference(ref.tokens, s.tokens)}"


def test_the_shipped_calibration_is_picked_per_pair_and_labels_stay(engine, hybrid):
    a = engine.session("def parse(line):\n    ", policy="path:8", max_new_tokens=8)
    b = hybrid.session("def parse(line):\n    ", policy="path:8", max_new_tokens=8)
    assert a.policy == b.policy == PathTree(8) and str(a.policy) == "PathTree(8)"
    assert a.policy.calibration_data().path == str(SHIPPED["dense"])
    assert b.policy.calibration_data().path == str(SHIPPED["hybrid"])
    c = a.step()
    assert c.policy == "PathTree(8)" and 1 <= c.n_nodes <= 8


# ------------------------------------------------------------------------------------------ bad calibration
def doctored(tmp_path, change, name="cal.json", source="dense"):
    d = json.loads(SHIPPED[source].read_text())
    change(d)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


@pytest.mark.parametrize("change,msg", [
    (lambda d: d["pair"].update(vocab=32000), "its vocabulary size is 32000, this pair's 4096"),
    (lambda d: d["pair"].update(block_size=8), "its drafter block size is 8, this pair's 16"),
    (lambda d: d["pair"]["drafter"].update(weights="0123456789abcdef"), "its drafter is qwen3, 2 layers x 256, "
                                                                        "weights 0123456789abcdef"),
    (lambda d: d["made"].update(cycles=57), f"was made from 57 cycles; the path estimate needs at least {MIN_CYCLES}"),
    (lambda d: d["acceptance"]["hits"].update(off=3), "in the off state\\(s\\) only 3 time"),
    (lambda d: d.update(format="something else"), "is not a calibration file"),
])
def test_a_bad_calibration_is_refused_in_one_line_before_any_decode(engine, tmp_path, change, msg):
    path = doctored(tmp_path, change)
    for policy in (PathTree(8, calibration=path), CutTree(8, calibration=path)):
        with pytest.raises(CalibrationError, match=msg) as e:
            engine.session("def f():\n    ", policy=policy, max_new_tokens=8)
        assert "\n" not in str(e.value) and isinstance(e.value, ValueError)


def test_another_pairs_calibration_is_refused_and_a_policy_change_is_checked(engine):
    with pytest.raises(CalibrationError, match="was made on another pair: its drafter is"):
        engine.session("x = 1\n", policy=PathTree(8, calibration="hybrid"), max_new_tokens=8)
    s = engine.session("x = 1\n", policy=wb.DFlash(), max_new_tokens=8)
    with pytest.raises(CalibrationError, match="made on another pair"):
        s.policy = CostTree(16, calibration="hybrid")
    assert s.policy == wb.DFlash() and not s.cycles


def test_a_pair_without_a_shipped_calibration_is_refused(tiny_engines):
    with pytest.raises(CalibrationError, match="no shipped calibration was made on this pair .*calibration=FILE"):
        tiny_engines["l4-h32"].session("t1 t2", policy=PathTree(4), max_new_tokens=4)


def test_costtree_needs_a_cost_table_and_cuttree_a_threshold(engine, tmp_path):
    path = doctored(tmp_path, lambda d: d.update(cost=None, thresholds={}))
    with pytest.raises(CalibrationError, match="holds no cost table"):
        engine.session("x", policy=CostTree(8, calibration=path), max_new_tokens=4)
    with pytest.raises(CalibrationError, match="holds no tree threshold"):
        engine.session("x", policy=CutTree(8, calibration=path), max_new_tokens=4)
    engine.session("x", policy=CutTree(8, threshold=0.2, calibration=path), max_new_tokens=4).step()  # given: fine
    engine.session("x", policy=PathTree(8, calibration=path), max_new_tokens=4).step()


def test_an_unbound_policy_outside_a_session_says_how(engine):
    d = drafted_for(engine, rows=1)
    with pytest.raises(CalibrationError, match="not bound to a pair"):
        PathTree(8).build_tree(d, torch.tensor([5]), False)
    t = PathTree(8, calibration="dense").build_tree(d, torch.tensor([5]), False)
    validate_tree(t, 8, d.logprobs.shape[-1], torch.tensor([5]), d.logprobs.shape[1])


# ------------------------------------------------------------------------------------------ cost and cut
def drafted_for(engine, rows: int, prompt: str = "def parse(line):\n    ") -> Draft:
    """One real drafter output, its record saying the forward drafted for ``rows`` rows."""
    s = engine.session(prompt, policy=wb.DFlash(), max_new_tokens=32, record_topk=16)
    c = s.step()
    lp = torch.full((1, c.draft_topk_tokens.shape[0], engine.models.target.config.vocab_size), -30.0)
    lp.scatter_(2, c.draft_topk_tokens[None], c.draft_topk_logprobs.float()[None])
    lp = torch.log_softmax(lp, -1)
    rec = ForwardRecord("draft", ForwardMode.TARGET_VERIFY,
                        {"input_ids": {"shape": [rows, engine.models.block_size], "dtype": "int64", "device": "cpu"}})
    return Draft(lp, rec)


def test_the_budget_per_cycle_shrinks_with_the_batch(engine):
    cost = load("dense").step_cost()
    assert cost.ms(8, 17) > cost.ms(1, 17) and cost.ms(8, 33) - cost.ms(8, 9) > cost.ms(1, 33) - cost.ms(1, 9)
    scores = np.log(np.array([0.9, 0.8, 0.7, 0.55, 0.5, 0.4, 0.35, 0.3, 0.25, 0.2, 0.18, 0.15, 0.12, 0.1, 0.08,
                              0.07, 0.06, 0.05, 0.04, 0.03] + [0.02] * 20))
    m1, m8 = budget_for(scores, 1, cost), budget_for(scores, 8, cost)
    assert 1 <= m8 < m1 <= len(scores)
    policy = CostTree(64, calibration="dense")
    seen = {}
    for prompt in ("def parse(line):\n    ", "import os\n\n\ndef main():\n    ", "class Stack:\n    def __init__(self"):
        for rows in (1, 8):
            t = policy.build_tree(drafted_for(engine, rows, prompt), torch.tensor([3]), False)
            seen.setdefault(prompt, {})[rows] = t.n - 1
    assert all(v[8] <= v[1] for v in seen.values()) and any(v[8] < v[1] for v in seen.values()), seen


def test_a_higher_threshold_keeps_fewer_nodes(engine):
    d = drafted_for(engine, 1)
    counts = [CutTree(32, threshold=t, calibration="dense").build_tree(d, torch.tensor([3]), False).n - 1
              for t in (0.01, 0.05, 0.1, 0.2, 0.4, 0.8)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1] >= 1, counts
    chain = [CutTree(15, threshold=t, width=1, calibration="dense").build_tree(d, torch.tensor([3]), False)
             for t in (0.05, 0.5)]
    assert chain[0].n >= chain[1].n and all(bool((c.parents[0, 1:] == torch.arange(c.n - 1)).all()) for c in chain)
    s = np.log(np.array([0.9, 0.5, 0.3, 0.1]))
    assert [kept_nodes(s, t) for t in (0.05, 0.2, 0.4, 0.95)] == [4, 3, 2, 1]


def test_the_path_tree_scores_are_path_estimates(engine):
    """A node's score is its parent's plus log q of its own candidate (q < 1), and the tree is valid."""
    d = drafted_for(engine, 1)
    t = PathTree(32, calibration="dense").build_tree(d, torch.tensor([3]), False)
    validate_tree(t, 32, d.logprobs.shape[-1], torch.tensor([3]), d.logprobs.shape[1])
    par = t.parents[0, 1:]
    assert bool((t.score[0, 1:] < t.score[0][par]).all())
    assert bool((t.score[0, 1:].diff() <= 1e-12).all())  # best-first: scores never rise in node order
    top = top_slots(d.logprobs, 16)[1][0]  # the node tokens are the drafter's candidates at their ranks
    assert all(int(top[int(t.depth[0, i]) - 1, int(t.rank[0, i])]) == int(t.tokens[0, i]) for i in range(1, t.n))


# ------------------------------------------------------------------------------------------ the pair head
def test_a_head_made_with_another_tokenizer_is_refused_before_any_decode(engine, tmp_path):
    import numpy as np

    from workbench.engine.policies.pair_head import load_head

    head = load_head(SHIPPED["dense"].parent / "pair_head.npz")
    meta = dict(head.meta, tokenizer="0000000000000000")
    np.savez(tmp_path / "pair_head.npz", meta=np.array(json.dumps(meta)), succ_ids=head.succ_ids,
             succ_logp=head.succ_logp, backoff_logp=head.backoff_logp)
    from workbench.engine.policies.calibration import file_sha256

    path = doctored(tmp_path, lambda d: d["pair_head"].update(file="pair_head.npz",
                                                               sha256=file_sha256(tmp_path / "pair_head.npz")))
    for policy in (PairTree(8, calibration=path), PairChain(4, calibration=path)):
        with pytest.raises(CalibrationError, match="does not match this drafter's tokens: its tokenizer is "
                                                   "0000000000000000") as e:
            engine.session("def f():\n    ", policy=policy, max_new_tokens=8)
        assert "\n" not in str(e.value)
    changed = doctored(tmp_path, lambda d: d["pair_head"].update(file="pair_head.npz"), name="changed.json")
    with pytest.raises(CalibrationError, match="changed since calibration"):
        engine.session("x", policy=PairTree(8, calibration=changed), max_new_tokens=4)
    none = doctored(tmp_path, lambda d: d.update(pair_head=None), name="none.json")
    with pytest.raises(CalibrationError, match="holds no pair head"):
        engine.session("x", policy=PairChain(4, calibration=none), max_new_tokens=4)


def test_the_pair_chain_is_the_viterbi_path():
    g = torch.Generator().manual_seed(0)
    inc = -torch.rand(2, 5, 3, 3, generator=g, dtype=torch.float64) * 2
    inc[:, 0] = inc[:, 0, :, :1]  # slot 0 does not depend on a previous candidate
    ranks, score = best_chain(inc)
    import itertools

    for b in range(2):
        best = max(itertools.product(range(3), repeat=5),
                   key=lambda r: sum(float(inc[b, d, r[d], r[d - 1] if d else 0]) for d in range(5)))
        assert ranks[b].tolist() == list(best)
        assert score[b, -1].item() == pytest.approx(sum(float(inc[b, d, best[d], best[d - 1] if d else 0]) for d in range(5)))


def test_with_beta_zero_the_head_changes_nothing(engine):
    """beta 0: each candidate keeps the drafter's own probability, so PairChain is DFlash's chain cut to its
    width's candidates and its first choice per slot is the argmax."""
    from workbench.engine.policies.pair_head import conditioned_increments, load_head

    head = load_head(SHIPPED["dense"].parent / "pair_head.npz")
    d = drafted_for(engine, 1)
    v, i = top_slots(d.logprobs, 4)
    inc = conditioned_increments(head, v, i, torch.tensor([3]), 0.0)
    assert torch.allclose(inc, v.double()[..., None].expand_as(inc))
    ranks, _ = best_chain(inc)
    assert ranks.tolist() == [[0] * d.logprobs.shape[1]]


def test_a_calibration_path_keeps_its_case_and_names_are_read_in_any_case():
    p = parse_policy("PathTree(16, calibration=/tmp/Cal/Dense.json)")
    assert p.calibration == "/tmp/Cal/Dense.json"  # a file's path as written (a case-sensitive file system)
    assert parse_policy(str(p)) == p and parse_policy(repr(p)) == p
    assert parse_policy("PATHTREE(16, Calibration='Hybrid')") == PathTree(16, calibration="hybrid")
    assert parse_policy("CUT:8:0.2") == CutTree(8, threshold=0.2)
    assert parse_policy("CutTree(8, Threshold=None, Width=1)") == CutTree(8, width=1)
