"""Custom tree policies: the tree contract (validate_tree), and lossless greedy decoding for every
built-in policy and for deliberately odd custom trees."""
from __future__ import annotations

import pytest
import torch

import workbench as wb
from ddtree_kernels import InvalidTree, Tree, build_tree, chain_tree, validate_tree
from shared_checks import assert_greedy_equals_ar


def odd_build(lp, roots, budget):
    """A valid but strange tree: depth-first order (not best-first), the drafter's *worst* token as a
    sibling at every depth, a random-token leaf under each of those, and the argmax chain. No scores."""
    bs, D, V = lp.shape
    g = torch.Generator().manual_seed(int(roots[0]))
    tokens, parents, depth = [int(roots[0])], [-1], [0]
    chain = 0
    for d in range(D):
        best, worst = int(lp[0, d].argmax()), int(lp[0, d].argmin())
        for tok, leaf in ((worst, True), (best, False)):
            if len(tokens) > budget or (tok == best and not leaf and worst == best and d):
                break
            tokens.append(tok), parents.append(chain), depth.append(d + 1)
            here = len(tokens) - 1
            if leaf and d + 1 < D and len(tokens) <= budget:
                tokens.append(int(torch.randint(V, (1,), generator=g))), parents.append(here), depth.append(d + 2)
            if not leaf:
                chain = here
    n = min(len(tokens), budget + 1)
    t = lambda x: torch.tensor([x[:n]])  # noqa: E731
    return Tree(t(tokens), t(parents), t(depth), torch.zeros(1, n, dtype=torch.long), torch.zeros(1, n))


def reversed_ddtree(lp, roots, budget):
    """The DDTree's nodes breadth-first, worst node of each depth first (an order no built-in uses)."""
    tree = build_tree(lp, roots, budget)
    n = tree.n
    order = torch.sort(tree.depth[0] * (n + 1) + (n - torch.arange(n)), stable=True).indices
    where = torch.empty_like(order)
    where[order] = torch.arange(n)
    par = torch.where(tree.parents[0, order] < 0, -1, where[tree.parents[0, order].clamp(min=0)])
    return Tree(tree.tokens[:, order], par[None], tree.depth[:, order], tree.rank[:, order], tree.score[:, order])


CUSTOM = [wb.TreePolicy(odd_build, "odd", budget=12), wb.TreePolicy(reversed_ddtree, "reversed", budget=24)]
# DFlash and DDTree(budget) are covered the same way in test_engine.py.
BUILTIN = [wb.DDTree(8, width=2), wb.EagleTree(1, 6, 7), wb.EagleTree(2, 4, 9), wb.EagleTree(3, 8, 40)]


@pytest.mark.parametrize("shape", ["l4-h32", "l3-h48-b5", "l6-h32-d2"])
def test_greedy_equals_ar_for_every_policy_on_random_models(tiny_engines, shape):
    engine = tiny_engines[shape]
    slots = engine.models.block_size - 1  # an EagleTree deeper than the drafter's slots is refused at start

    def fit(p, steps):  # as many nodes as that many steps can draft
        return wb.EagleTree(p.topk, steps, min(p.num_draft_tokens, 1 + p.topk + (steps - 1) * p.topk ** 2))

    fitted = [fit(p, min(p.steps, slots)) if isinstance(p, wb.EagleTree) else p for p in BUILTIN]
    assert_greedy_equals_ar(engine, ["t1 t2 t3", "t4 t9 t4 t9 t1"], fitted + CUSTOM, 24, seeded=True,
                            label=f"{shape} ")


def test_greedy_equals_ar_for_every_policy_on_embedded_default(engine, eval_prompts):
    assert_greedy_equals_ar(engine, [it["prompt"] for it in eval_prompts[2:4]],
                            [wb.EagleTree(4, 5, 16), wb.EagleTree(2, 8, 16)] + CUSTOM, 32,
                            node_cap=lambda policy: policy.budget)


def test_the_lossless_check_names_a_policy_whose_output_differs(tiny_engines, monkeypatch):
    """The shared check can fail: a policy's sessions sampled hot (not greedy) are named with where they differ."""
    engine = tiny_engines["l4-h32"]
    session = engine.session

    def hot_unless_ar(prompt, policy, **kw):
        return session(prompt, policy=policy, **kw, **({} if policy == wb.AR() else {"temperature": 5.0}))

    monkeypatch.setattr(engine, "session", hot_unless_ar)
    with pytest.raises(AssertionError, match=r"^DDTree\(8\) prompt 0 't1 t2 t3' \(batch=False\): differs at \d+"):
        assert_greedy_equals_ar(engine, ["t1 t2 t3"], [wb.DDTree(8)], 16)


def test_odd_tree_really_is_odd(engine):
    s = engine.session("def parse(line):\n    ", policy=CUSTOM[0], max_new_tokens=10)
    c = s.step()
    assert c.n_nodes == 12 and c.policy == "odd(12)"
    assert not torch.all(c.depth[1:-1] <= c.depth[2:])  # not breadth-first


# ------------------------------------------------------------------------- the contract
def good_tree():
    lp = torch.log_softmax(torch.randn(2, 4, 10, generator=torch.Generator().manual_seed(0)), -1)
    return build_tree(lp, torch.tensor([3, 4]), 6)


def with_(tree, **kw):
    f = {k: getattr(tree, k).clone() for k in ("tokens", "parents", "depth", "rank", "score")}
    for k, fn in kw.items():
        f[k] = fn(f[k])
    return Tree(**f)


def setv(b, i, v):
    def fn(t):
        t[b, i] = v
        return t
    return fn


BAD = [
    (lambda t: "not a tree", "returned str, not a ddtree_kernels.Tree"),
    (lambda t: with_(t, tokens=lambda x: x.int()), "Tree.tokens is torch.int32; it must be torch.int64"),
    (lambda t: with_(t, score=lambda x: x[:, :-1]), r"Tree.score has shape \[2, 6\]"),
    (lambda t: with_(t, parents=setv(1, 0, 0)), r"the root \(node 0, batch 1\) must have parent -1"),
    (lambda t: with_(t, tokens=setv(0, 0, 9)), r"node 0 \(batch 0\) has token 9, but the root must be the bonus token 3"),
    (lambda t: with_(t, parents=setv(1, 3, 5)), r"node 3 \(batch 1\) has parent 5; a parent must precede its child"),
    (lambda t: with_(t, parents=setv(0, 2, -1)), r"node 2 \(batch 0\) has parent -1"),
    (lambda t: with_(t, depth=setv(0, 4, 7)), r"node 4 \(batch 0\) has depth 7 but its parent"),
    (lambda t: with_(t, tokens=setv(1, 2, 10)), r"node 2 \(batch 1\) has token 10, outside the vocabulary \[0, 10\)"),
    (lambda t: with_(t, tokens=setv(0, 5, -1)), r"node 5 \(batch 0\) has token -1"),
]


@pytest.mark.parametrize("make,match", BAD)
def test_validate_tree_names_the_first_violation(make, match):
    validate_tree(good_tree(), 6, 10, torch.tensor([3, 4]), 4)  # the unmodified tree passes
    with pytest.raises(InvalidTree, match=match):
        validate_tree(make(good_tree()), 6, 10, torch.tensor([3, 4]), 4)


def test_validate_tree_budget_depth_and_duplicate_siblings():
    t = good_tree()
    with pytest.raises(InvalidTree, match="6 drafted nodes exceed the budget of 5"):
        validate_tree(t, 5, 10)
    chain = chain_tree(torch.tensor([[1, 2, 3, 4]]), torch.tensor([0]))
    with pytest.raises(InvalidTree, match=r"node 4 \(batch 0\) is at depth 4, deeper than the 3 drafted slots"):
        validate_tree(chain, 8, 10, max_depth=3)
    dup = Tree(torch.tensor([[0, 5, 6, 5]]), torch.tensor([[-1, 0, 0, 0]]), torch.tensor([[0, 1, 1, 1]]),
               torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4))
    with pytest.raises(InvalidTree, match=r"node 3 \(batch 0\) repeats token 5 of a sibling under parent 0"):
        validate_tree(dup, 8, 10)
    # the same token under different parents is fine
    validate_tree(Tree(torch.tensor([[0, 5, 5]]), torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]]),
                       torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3)), 8, 10)


def test_engine_rejects_a_bad_custom_tree_in_one_line(engine):
    def too_big(lp, roots, budget):
        return build_tree(lp, roots, budget + 3)

    s = engine.session("x = 1\n", policy=wb.TreePolicy(too_big, "greedy-guy", budget=5), max_new_tokens=8)
    with pytest.raises(InvalidTree, match=r"^TreePolicy 'greedy-guy': 8 drafted nodes exceed the budget of 5$"):
        s.step()

    def wrong_root(lp, roots, budget):
        return chain_tree(lp.argmax(-1), roots + 1, lp)

    s = engine.session("x = 1\n", policy=wb.TreePolicy(wrong_root, "off-by-one"), max_new_tokens=8)
    with pytest.raises(InvalidTree, match="but the root must be the bonus token"):
        s.step()


def test_tree_policy_arguments():
    with pytest.raises(TypeError, match="is not callable"):
        wb.TreePolicy(build=3)
    with pytest.raises(ValueError, match="budget=0"):
        wb.TreePolicy(build=build_tree, budget=0)
    p = wb.TreePolicy(build=build_tree, name="plain", budget=16)
    assert str(p) == "plain(16)" and p.budget == 16
