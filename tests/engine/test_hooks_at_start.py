"""Hooks given when a session is made (``engine.session(..., hooks=...)``): the prefill's points fire for them,
they stay on for every cycle, and they are checked as ``s.hooks(...)`` checks them. A prefill hook attached to a
session whose prefill has run would never fire: refused in one line. A bad tree on one row of a batch is named by
its row."""
from __future__ import annotations

import pytest
import torch

import workbench as wb
from ddtree_kernels import Tree
from test_engine import tiny_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def engine(tiny_engines):
    return tiny_engines["l4-h32"]


@pytest.fixture(scope="module")
def prompts(engine):
    return tiny_prompts(engine, 3, seed=60)


def test_prefill_hooks_given_when_the_session_is_made_fire(engine, prompts):
    seen = []
    s = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12,
                       hooks=[("prefill.hook_begin", lambda v, h: seen.append(("begin", list(v), h.cycle))),
                              ("prefill.hook_end", lambda e, h: seen.append(("end", e, h.request))),
                              ("cycle.hook_record", lambda c, h: seen.append(("record", c.index, h.request)))])
    assert seen == [("begin", s.prompt_ids, None), ("end", None, s)]  # the prefill ran with them, in order
    s.run()
    assert [x[1] for x in seen[2:]] == list(range(len(s.cycles))) and all(x[2] is s for x in seen[2:])
    plain = engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12)
    plain.run()
    assert s.tokens == plain.tokens  # observers change nothing


@pytest.mark.parametrize("hooks, match", [
    ([("prefill.hook_start", lambda v, h: None)], "no hook point 'prefill.hook_start'"),
    ([("prefill.hook_begin", "not a function")], "is str, not a function"),
    (["prefill.hook_begin"], r"a hook is a \(point, fn\) pair"),
])
def test_hooks_given_when_the_session_is_made_are_checked_before_the_prefill(engine, prompts, hooks, match):
    with pytest.raises(ValueError, match=match) as e:
        engine.session(prompts[0], policy=wb.DDTree(6), max_new_tokens=12, hooks=hooks)
    assert "\n" not in str(e.value)


def test_a_prefill_hook_on_a_session_whose_prefill_ran_is_refused(engine, prompts):
    s = engine.session(prompts[1], policy=wb.DDTree(6), max_new_tokens=12)
    b = engine.batch_session(prompts, policy=wb.DDTree(6), max_new_tokens=12)
    calls = []
    for attach in (lambda f: s.hooks(("prefill.hook_begin", f)).__enter__(),
                   lambda f: s.step(hooks=[("prefill.hook_end", f)]),
                   lambda f: s.run_with_hooks(hooks=[("prefill.hook_begin", f)]),
                   lambda f: b.hooks(("prefill.hook_begin", f)).__enter__(),
                   lambda f: b.step(hooks=[("prefill.hook_end", f)])):
        with pytest.raises(ValueError, match=r"the prefill ran when the session was made.*"
                                             r"engine.session\(\.\.\., hooks=") as e:
            attach(lambda v, h: calls.append(v))
        assert "\n" not in str(e.value)
    assert not s.hook_points and not any(x.hook_points for x in b.sessions) and not s.cycles and not calls


def bad_chain(root: int) -> Tree:
    """A tree whose node 2 names a parent after it (not prefix-closed)."""
    return Tree(torch.tensor([[root, 3, 4]]), torch.tensor([[-1, 2, 0]]), torch.tensor([[0, 1, 1]]),
                torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3))


def test_a_bad_replaced_tree_in_a_batch_is_named_by_its_row(engine, prompts):
    b = engine.batch_session(prompts, policy=wb.DDTree(6), max_new_tokens=12)
    with pytest.raises(ValueError) as e:
        b.step(hooks=[("tree_build", lambda t, h: bad_chain(int(t.tokens[0, 0])) if h.row == 2 else None)])
    msg = str(e.value)
    assert "row 2" in msg and "batch 0" not in msg and "\n" not in msg, msg


def test_a_bad_custom_tree_in_a_batch_is_named_by_its_row(engine, prompts):
    good = wb.DDTree(6)
    bad = wb.TreePolicy(lambda lp, roots, budget: bad_chain(int(roots[0])), name="broken", budget=6)
    b = engine.batch_session(prompts, policy=[good, good, bad], max_new_tokens=12)
    with pytest.raises(ValueError) as e:
        b.step()
    msg = str(e.value)
    assert "TreePolicy 'broken'" in msg and "row 2" in msg and "batch 0" not in msg and "\n" not in msg, msg


def test_the_rows_messages(engine, prompts):
    """What each bad tree says, row by row (printed on failure)."""
    b = engine.batch_session(prompts, policy=wb.DDTree(6), max_new_tokens=12)
    with pytest.raises(ValueError) as e:
        b.step(hooks=[("tree_build", lambda t, h: bad_chain(int(t.tokens[0, 0])) if h.row == 1 else None)])
    assert str(e.value).startswith("the tree a cycle.hook_tree hook returned for row 1: node 1 has parent 2"), e.value
    over = wb.TreePolicy(lambda lp, roots, budget: bad_chain(int(roots[0])), name="broken", budget=1)
    b = engine.batch_session(prompts, policy=[wb.DDTree(6), over, over], max_new_tokens=12)
    with pytest.raises(ValueError, match=r"^row 1: TreePolicy 'broken': 2 drafted nodes exceed the budget of 1$"):
        b.step()
