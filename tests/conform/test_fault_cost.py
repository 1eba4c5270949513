"""What a fault cost (``workbench.conform.fault_cost``): the engine's output against plain greedy decoding and its
tau against the reference's own speculative decode; and a visibility that hides an ancestor checked, not crashed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import workbench as wb
from ddtree_kernels.accept import accept_walk
from workbench.conform.check import conform
from workbench.conform.dump import read_dump
from workbench.conform.fault_cost import fault_cost

sys.path.insert(0, str(Path(__file__).parent))
import faults  # noqa: E402  (tests/conform/faults.py: test-only)

pytestmark = pytest.mark.usefixtures("one_thread")
NEW = 12
CRASHED = 6  # the hidden ancestor's prompt crashed the accept walk within its first 6 tokens


def test_the_accept_walk_keeps_one_path_under_a_visibility_that_hides_an_ancestor():
    """Node 3 (under node 1) does not see node 1, which the target rejected: node 3 agrees with its parent's
    choice, yet the accepted path stops at the root, and its bonus is the root's choice."""
    tokens = torch.tensor([[7, 3, 4, 5]])  # root; 1 and 2 under it; 3 under 1
    parents, depth = torch.tensor([[-1, 0, 0, 1]]), torch.tensor([[0, 1, 1, 2]])
    vis = torch.tensor([[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]], dtype=torch.bool)
    choice = torch.tensor([[9, 5, 0, 0]])  # the root chose 9 (no child); node 1 chose 5 (node 3's token)
    a = accept_walk(tokens, parents, depth, vis, choice, 2)
    assert a.index.tolist() == [[0, -1, -1]] and a.length.tolist() == [0] and a.bonus.tolist() == [9]
    whole = vis.clone()
    whole[0, 3, 1] = True
    choice = torch.tensor([[3, 5, 0, 8]])
    for v in (vis, whole):  # the root chose node 1, node 1 chose node 3: the whole path, seen or not
        a = accept_walk(tokens, parents, depth, v, choice, 2)
        assert a.index.tolist() == [[0, 1, 3]] and a.length.tolist() == [2] and a.bonus.tolist() == [8]


@pytest.fixture(scope="module")
def ancestor_dropped_dump(engine, eval_prompts, tmp_path_factory):
    """The evaluation prompt on which a hidden ancestor made the engine's accept walk index past its path."""
    prompt = eval_prompts[4]["prompt"]
    mp = pytest.MonkeyPatch()
    faults.ancestor_dropped(mp)
    path = tmp_path_factory.mktemp("cost") / "ancestor.dump"
    try:
        s = engine.session(prompt, policy=wb.DDTree(16), max_new_tokens=CRASHED, record_topk=16, dump=path)
        s.run()
    finally:
        mp.undo()
    ar = engine.session(prompt, policy=wb.AR(), max_new_tokens=CRASHED)
    ar.run()
    return path, s.generated, ar.generated


def test_a_hidden_ancestor_is_checked_and_named_under_visibility_with_its_cost(ancestor_dropped_dump, engine):
    path, out, greedy = ancestor_dropped_dump
    r = conform(path, models=engine.models)
    assert r.broken[0] == "visibility", str(r)
    left = next((i for i, (a, b) in enumerate(zip(out, greedy)) if a != b), None)
    (rc,) = r.cost.requests
    assert rc.left_at == left and rc.tokens == len(out) == CRASHED
    text = str(r)
    assert ("what it cost: lossless" in text) == (left is None), text
    assert f"engine {r.cost.tau_engine:.2f} ({len(out) - 1} tokens in {r.cycles} forwards)" in text
    assert "Over its" not in text and "tokens lost per 100 target forwards" in text
    assert json.loads(json.dumps(r.to_dict()))["cost"]["requests"][0]["left_greedy_at"] == left


def test_a_clean_run_is_lossless_with_the_references_tau_and_a_fault_that_diverges_costs(engine, tmp_path,
                                                                                          monkeypatch):
    prompt = "def parse(line):"
    engine.session(prompt, policy=wb.DDTree(16), max_new_tokens=NEW, record_topk=16, dump=tmp_path / "c.dump").run()
    head, _ = read_dump(tmp_path / "c.dump")
    clean = fault_cost(tmp_path / "c.dump", head, engine.models)
    assert clean.lossless and clean.tau_engine == clean.tau_reference and clean.lost_per_100 == 0
    faults.positions_by_index(monkeypatch)
    s = engine.session(prompt, policy=wb.DDTree(16), max_new_tokens=NEW, record_topk=16, dump=tmp_path / "f.dump")
    s.run()
    monkeypatch.undo()
    cost = fault_cost(tmp_path / "f.dump", head, engine.models)
    (rc,) = cost.requests
    ar = engine.session(prompt, policy=wb.AR(), max_new_tokens=NEW)
    ar.run()
    assert rc.left_at == next(i for i, (a, b) in enumerate(zip(s.generated, ar.generated)) if a != b)
    assert cost.tau_reference == clean.tau_reference > cost.tau_engine and cost.lost_per_100 > 0
    assert cost.lines()[0].startswith(f"what it cost: not lossless: the engine's output leaves plain greedy decoding "
                                      f"in 1 of 1 request(s) (request 0 at generated token {rc.left_at} of {NEW})")


def test_a_sampled_dump_or_a_slice_of_steps_says_in_one_line_why_its_cost_is_not_judged(tmp_path):
    lines = [json.dumps({"format": "ddtree-workbench-dump", "version": 1, "engine": {"name": "x"}, "pair": {},
                         "sampling": {"temperature": 0.7}})]
    (tmp_path / "s.dump").write_text("\n".join(lines) + "\n")
    head, _ = read_dump(tmp_path / "s.dump")
    cost = fault_cost(tmp_path / "s.dump", head, models=None)
    (line,) = cost.lines()
    assert line.startswith("what it cost: not judged: the run samples (temperature 0.7)") and not cost.requests
    assert cost.to_dict()["judged"] is False
    from workbench.conform.selection import selection

    head["sampling"] = {"temperature": 0.0}
    (line,) = fault_cost(tmp_path / "s.dump", head, models=None, sel=selection((2, 5))).lines()
    assert line == ("what it cost: not judged: this check judged engine steps 2 to 4 only, and the cost is a whole "
                    "run's: check without cycles= for it")
