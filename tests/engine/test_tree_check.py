"""Every tree a policy builds is checked before the target verifies it, whoever built it: a plugin's policy (alone
and in a batch, the row named), a built-in batched build (here a planted bad kernel), and a check left to the
commit's host read under static shapes (a build that never waits for the device), where the bad row verifies as
an inert tree and nothing is committed (tests/engine/test_static_shapes.py: good trees decode as with dynamic
shapes, and nothing is read from the device before the verify)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import workbench as wb
from ddtree_kernels import InvalidTree, Tree
from workbench.engine import policies
from workbench.engine.policies import ddtree
from workbench.engine.stages import tree_check
from test_engine import tiny_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

PARENT_2 = ("node 1{row} has parent 2; a parent must precede its child (0 <= parent < 1), so that every prefix of a "
            "node is in the tree")


@pytest.fixture(scope="module")
def engine(tiny_engines):
    return tiny_engines["l4-h32"]


@pytest.fixture(scope="module")
def prompts(engine):
    return tiny_prompts(engine, 3, seed=61)


@dataclasses.dataclass(frozen=True)
class Crossed(policies.Policy):
    """A plugin's policy whose build_tree returns parents [-1, 2, 0]: node 1's parent comes after it."""

    kind = "crossed"
    usage = "crossed"

    def static_nodes(self, block_size: int) -> int:
        return 3

    def build_tree(self, drafted, roots, sync_free):
        r = roots.reshape(1, 1)
        return Tree(torch.cat([r, r * 0 + 3, r * 0 + 4], dim=1), torch.tensor([[-1, 2, 0]]),
                    torch.tensor([[0, 1, 1]]), torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3))

    def __str__(self) -> str:
        return "Crossed"


@pytest.fixture
def crossed():
    policies.register(Crossed)
    yield Crossed()
    policies.unregister("crossed")


def test_a_plugin_tree_that_is_not_prefix_closed_is_refused_before_its_verify(engine, prompts, crossed):
    s = engine.session(prompts[0], policy=crossed, max_new_tokens=12)
    with pytest.raises(InvalidTree) as e:
        s.step()
    assert str(e.value) == "the tree Crossed built: " + PARENT_2.format(row="")
    assert len(s.cycles) == 0 and len(s.generated) == 1  # nothing verified was kept


def test_a_plugin_tree_in_a_batch_is_named_by_its_row(engine, prompts, crossed):
    b = engine.batch_session(prompts, policy=[wb.DDTree(6), wb.DFlash(), crossed], max_new_tokens=12)
    with pytest.raises(InvalidTree) as e:
        b.step()
    assert str(e.value) == "the tree Crossed built: " + PARENT_2.format(row=" (row 2)")


def plant(monkeypatch, row: int) -> None:
    """DDTree's builds (the host heap's, the device one's) give row ``row`` of a batched build a node whose parent
    comes after it."""
    def planted(real):
        def bad(*a, **k):
            t = real(*a, **k)
            if t.parents.shape[0] > row:
                t.parents[row, 2] = 5
            return t
        return bad

    for name in ("build_tree_from_topk", "build_tree_vectorized"):
        monkeypatch.setattr(ddtree, name, planted(getattr(ddtree, name)))


def test_a_built_in_batched_build_is_checked_and_names_the_row(engine, prompts, monkeypatch):
    calls = []
    monkeypatch.setattr(wb.DDTree, "build_rows", lambda self, d, r, sf, f=wb.DDTree.build_rows:
                        calls.append(len(r)) or f(self, d, r, sf))
    plant(monkeypatch, 1)
    b = engine.batch_session(prompts, policy=wb.DDTree(6), max_new_tokens=12)
    with pytest.raises(InvalidTree, match=r"^the tree DDTree\(6\) built: node 2 \(row 1\) has parent 5; a parent "
                                          r"must precede its child \(0 <= parent < 2\)"):
        b.step()
    assert calls == [3]  # the three rows were built in one call: the batched path


@pytest.mark.parametrize("who", ["plugin", "built-in"])
def test_a_check_left_to_the_commit_stops_the_cycle_before_anything_is_kept(engine, prompts, monkeypatch, crossed,
                                                                            who):
    policy = [wb.DDTree(6), wb.DDTree(6), crossed] if who == "plugin" else wb.DDTree(6)
    if who == "built-in":
        plant(monkeypatch, 2)
    b = engine.batch_session(prompts, policy=policy, max_new_tokens=12, static_shapes=True)
    with pytest.raises(InvalidTree) as e:
        b.step()
    want = "the tree Crossed built: " + PARENT_2.format(row=" (row 2)") if who == "plugin" else \
        "the tree DDTree(6) built: node 2 (row 2) has parent 5"
    assert str(e.value).startswith(want) and "\n" not in str(e.value)
    assert all(len(s.cycles) == 0 and len(s.generated) == 1 for s in b.sessions)


def test_the_vectorised_rules_agree_with_validate_tree_on_planted_faults():
    """Each rule on one row of a stack: only that row is flagged; an inert row indexes nothing out of range."""
    tok = torch.tensor([[7, 3, 4, 5]]).repeat(7, 1)
    par = torch.tensor([[-1, 0, 0, 1]]).repeat(7, 1)
    dep = torch.tensor([[0, 1, 1, 2]]).repeat(7, 1)
    par[1, 3] = 3  # its own parent
    par[2, 0] = 0  # a root with a parent
    dep[3, 3] = 1  # depth not the parent's + 1
    tok[4, 2] = 99  # outside the vocabulary
    tok[5, 2] = 3  # a sibling's token again
    tok[6, 0] = 8  # not the bonus token
    bad = tree_check.tree_faults(tok, par, dep, torch.full((7,), 7), vocab=10, max_depth=2)
    assert bad.tolist() == [False] + [True] * 6
    assert tree_check.tree_faults(tok[:1], par[:1], dep[:1], torch.tensor([7]), 10, max_depth=1).tolist() == [True]
    trees = [Tree(tok[j : j + 1], par[j : j + 1], dep[j : j + 1], dep[j : j + 1] * 0, dep[j : j + 1] * 0.0)
             for j in range(7)]
    inert = tree_check.inert_where(bad, tok, par, dep, torch.full((7,), 7), trees)
    assert torch.equal(inert[0].parents, par[:1]) and inert[1].parents.tolist() == [[-1, 0, 0, 0]]
    assert inert[4].tokens.tolist() == [[7, 7, 7, 7]] and inert[4].depth.tolist() == [[0, 1, 1, 1]]


def test_a_tree_with_fields_on_two_devices_is_named_in_one_line():
    t = Tree(torch.tensor([[7, 3]]), torch.tensor([[-1, 0]]), torch.tensor([[0, 1]]),
             torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, device="meta"))
    with pytest.raises(InvalidTree, match=r"^row 1: the tree P built: Tree.score is on meta but Tree.tokens on cpu; "
                                          r"every field must be on one device$"):
        tree_check.check_trees([t, t], [(1, "the tree P built", 7, 10, 1)], None, False)
