"""The tree contract for the calibrated policies: PathTree, PairTree and PairChain trees rebuilt
from the pair's calibration and the dump's drafter top-k; CostTree and CutTree, a top-k too short and a calibration
of another pair reported as not checked with what a rebuild needs, never as passed; a tree built by the wrong rule
named under the tree contract."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddtree_kernels.path_tree import path_tree_heap, rank_class
from workbench.conform.calibrated_trees import best_chain, best_prefixes, path_state
from workbench.conform.check import conform
from workbench.engine.policies import CostTree, CutTree, DDTree, PairChain, PairTree, PathTree
from workbench.engine.policies.pair_chain import best_chain as engine_chain

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "def parse(line):"


def dump(engine, path: Path, policy, topk: int = 16, new: int = 20) -> Path:
    engine.session(PROMPT, policy=policy, max_new_tokens=new, record_topk=topk, dump=path).run()
    return path


def relabel(path: Path, out: Path, label: str) -> Path:
    """The dump with every record's policy label replaced (the request's and each cycle's)."""
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for obj in lines:
        if "policy" in obj:
            obj["policy"] = label
    out.write_text("".join(json.dumps(o) + "\n" for o in lines))
    return out


@pytest.mark.parametrize("policy", [PathTree(16), PairTree(16), PairChain(8)], ids=str)
def test_a_calibrated_tree_is_rebuilt_and_a_clean_run_passes(policy, engine, tmp_path):
    r = conform(dump(engine, tmp_path / "run.dump", policy), models=engine.models)
    tree = r.results["tree"]
    assert r.broken == [], str(r)
    assert tree.status == "passed" and tree.checked == r.cycles and not tree.not_checked, tree


def test_a_tree_built_by_the_wrong_rule_is_named_under_the_tree_contract(engine, tmp_path, monkeypatch):
    # the engine builds DDTree's marginal tree while its records say PairTree(16): lossless still, so only the
    # tree contract can tell
    monkeypatch.setattr(PairTree, "build_tree", lambda self, drafted, roots, sync_free:
                        DDTree(self.budget).build_tree(drafted, roots, sync_free))
    path = dump(engine, tmp_path / "run.dump", PairTree(16))
    monkeypatch.undo()
    r = conform(path, models=engine.models)
    assert r.broken == ["tree"], str(r)
    assert r.results["tree"].first["evidence"].startswith("the tree lacks ")


@pytest.mark.parametrize("policy, why", [
    (CostTree(32), "CostTree(32) rebuilds need the rows that drafted together in each cycle and whether shapes "
                   "were static (its node count is chosen per cycle"),
    (CutTree(16), "CutTree(16) rebuilds need the rows that drafted together in each cycle and whether shapes were "
                  "static (its cut is read at a threshold chosen per batch size"),
    (CutTree(16, threshold=0.25), "CutTree(16, threshold=0.25) rebuilds need whether shapes were static (static "
                                  "shapes verify the whole tree, dynamic ones cut it at the threshold)"),
])
def test_cost_and_cut_trees_are_not_checked_and_say_what_a_rebuild_needs(policy, why, engine, tmp_path):
    r = conform(dump(engine, tmp_path / "run.dump", policy, new=12), models=engine.models)
    tree = r.results["tree"]
    assert tree.status == "not checked" and tree.checked == 0 and list(tree.not_checked)[0].startswith(why)
    assert r.broken == [] and r.results["target logits"].status == "passed"  # the other contracts still judge
    assert why in str(r)


def test_a_short_top_k_or_another_pairs_calibration_is_not_checked(engine, tmp_path):
    r = conform(dump(engine, tmp_path / "top8.dump", PathTree(16), topk=8, new=10), models=engine.models)
    assert r.results["tree"].status == "not checked" and list(r.results["tree"].not_checked) == [
        "PathTree(16) rebuilds need the drafter's top-16 per slot (the dump holds its top-8: write it with "
        "record_topk=16 or more)"]
    other = relabel(dump(engine, tmp_path / "run.dump", PathTree(16), new=10), tmp_path / "other.dump",
                    "PathTree(16, calibration=hybrid)")
    why = list(conform(other, models=engine.models).results["tree"].not_checked)
    assert len(why) == 1 and why[0].startswith("PathTree(16, calibration=hybrid) rebuilds need a calibration made "
                                               "on this pair (calibration ") and "was made on another pair" in why[0]


def test_the_references_follow_the_documented_rule_on_made_up_increments():
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        D, k, budget = 1 + trial % 5, 1 + trial % 4, 1 + 3 * trial
        inc = -torch.rand(1, D, k, 3, generator=g, dtype=torch.float64) * 3
        inc[0, :, :, 1] = inc[0, :, :, 0]  # equal increments across states: the tie rule decides there
        ids = torch.randperm(50, generator=g)[: D * k].reshape(1, D, k)
        want = path_tree_heap(inc, ids, torch.tensor([7]), budget)
        got = best_prefixes(inc[0].tolist(), ids[0].tolist(), 7, budget, path_state, 0)
        assert got == {"tokens": want.tokens[0].tolist(), "parents": want.parents[0].tolist()}, trial
        pair = -torch.rand(1, D, k, k, generator=g, dtype=torch.float64) * 3
        want = path_tree_heap(pair, ids, torch.tensor([7]), budget, rank_class, 0)
        got = best_prefixes(pair[0].tolist(), ids[0].tolist(), 7, budget, lambda c, r: r, 0)
        assert got["tokens"] == want.tokens[0].tolist() and got["parents"] == want.parents[0].tolist()
        ranks, _ = engine_chain(pair)
        chain = best_chain(pair[0].tolist(), ids[0].tolist(), 7)
        assert chain["tokens"] == [7] + [ids[0, d, r].item() for d, r in enumerate(ranks[0].tolist())]
    # a planted fault: the spine state kept after a sibling is a different rule, and a different tree
    inc = torch.tensor([[[[-0.1, -0.1, -0.1], [-0.2, -0.2, -0.2]],
                         [[-0.1, -3.0, -3.0], [-0.3, -0.3, -0.3]]]], dtype=torch.float64)  # [1, D=2, k=2, S=3]
    ids = torch.tensor([[[1, 2], [3, 4]]])
    right = best_prefixes(inc[0].tolist(), ids[0].tolist(), 0, 4, path_state, 0)
    wrong = best_prefixes(inc[0].tolist(), ids[0].tolist(), 0, 4, lambda s, r: s, 0)
    assert right["tokens"] == path_tree_heap(inc, ids, torch.tensor([0]), 4).tokens[0].tolist() == [0, 1, 2, 3, 4]
    assert wrong["tokens"] == [0, 1, 2, 3, 3]  # the sibling's top-1 child, scored as if still on the spine
