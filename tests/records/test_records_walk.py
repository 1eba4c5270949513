"""Cycle and Trace records checked on their own: every recorded accept figure against an independent walk of
the stored tree (written here, sharing no code with ``ddtree_kernels`` or ``cycle_problem``), without SGLang.

Per cycle: the accepted nodes, their tokens, the accepted length, the accept length, the bonus, the committed
count and the tokens the cycle added to the output; per trace: tau, the accept histogram, the new-token count,
and that the outputs are the prefill's token followed by every cycle's walk. The committed target K/V rows
are checked in path order (a state that kept the accepted rows reversed gives the same tokens: attention does
not depend on the order of its keys).
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import workbench as wb
from ddtree_kernels import accept_walk, compact_kv, compact_kv_, compile_tree
from ddtree_kernels.tree_build import Tree


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models on one thread


def walk_stored_tree(tokens: list[int], parents: list[int], choice: list[int]) -> tuple[list[int], int]:
    """From the root, step to the child whose token is the target's choice at the current node; stop where no
    child carries it. -> (path of node indices, root first; the bonus = the choice at the path's end)."""
    path = [0]
    while True:
        here = path[-1]
        nxt = [i for i in range(len(tokens)) if parents[i] == here and tokens[i] == choice[here]]
        assert len(nxt) <= 1, f"siblings under node {here} share token {choice[here]}"
        if not nxt:
            return path, choice[here]
        path.append(nxt[0])


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    from tiny_models import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("walk"), vocab=40, hidden=32, layers=3, layer_ids=(0, 2), block_size=6,
                     seed=11)
    return wb.load(target=t, draft=d)


def oracle_policy(eng, budget: int = 12) -> tuple[wb.TreePolicy, dict]:
    """A TreePolicy that drafts the target's own greedy continuation (plain forwards from scratch), so random
    tiny models accept long paths: a chain of the continuation with a wrong sibling at every depth; every
    third cycle the chain takes the wrong token at one depth and the right one is its sibling (the walk then
    leaves the first child). ``holder["s"]``: the session, set after it is made."""
    from ddtree_kernels.tree_build import Tree

    holder = {"calls": 0}
    V = eng.models.target.config.vocab_size - 2  # ordinary tokens only (no end-of-text, no mask)

    def build(logprobs, roots, budget_):
        s = holder["s"]
        ids = s.prompt_ids + s.generated
        depth = min(logprobs.shape[1], budget_ // 2)
        cont = []
        with torch.inference_mode():
            for _ in range(depth):
                cont.append(int(eng.models.target(input_ids=torch.tensor([ids + cont])).logits[0, -1].argmax()))
        holder["calls"] += 1
        swap = holder["calls"] % depth if holder["calls"] % 3 == 0 else -1
        tokens, parents, dep, rank = [int(roots[0])], [-1], [0], [0]
        chain = 0
        for d, g in enumerate(cont):
            other = (g + 1) % V if g < V else 0
            first, second = (other, g) if d == swap else (g, other)
            tokens += [first, second]
            parents += [chain, chain]
            dep += [d + 1, d + 1]
            rank += [0, 1]
            chain = len(tokens) - 2 if d != swap else len(tokens) - 1  # continue under the right token
        n = len(tokens)
        t = torch.tensor
        return Tree(t([tokens]), t([parents]), t([dep]), t([rank]), -t([dep], dtype=torch.float64))

    return wb.TreePolicy(build, name="oracle", budget=budget), holder


RUNS = [("oracle", {}), ("oracle", dict(temperature=0.7, seed=4)), ("ddtree", {}),
        ("dflash", dict(temperature=1.2, top_k=6, seed=1))]


def run_records(eng, which, kw, n=16):
    out = []
    for prompt in ("t1 t2 t3", "t5 t9"):
        holder = {}
        policy = {"ddtree": wb.DDTree(8), "dflash": wb.DFlash()}.get(which)
        if policy is None:
            policy, holder = oracle_policy(eng)
        s = eng.session(prompt, policy=policy, max_new_tokens=n, **kw)
        holder["s"] = s
        s.run()
        out.append(s)
    return out


@pytest.fixture(scope="module")
def runs(eng):
    return {w + str(kw): run_records(eng, w, kw) for w, kw in RUNS}


def check_trace_against_walk(s, trace: wb.Trace) -> None:
    generated = [s.generated[0]]  # the prefill's token
    lengths = []
    for i, c in enumerate(trace.cycles):
        tokens, parents, choice = c.tokens.tolist(), c.parents.tolist(), c.target_choice.tolist()
        path, bonus = walk_stored_tree(tokens, parents, choice)
        assert c.index == i
        assert c.root_token == tokens[0] == generated[-1], "the root is the previous cycle's bonus"
        assert c.start == len(s.prompt_ids) + len(generated) - 1
        assert c.position_ids.tolist() == [c.start + d for d in c.depth.tolist()]
        assert c.accepted_nodes.tolist() == path
        assert c.accepted_tokens.tolist() == [tokens[j] for j in path]
        assert c.accepted == len(path) - 1
        assert c.accept_length == len(path)
        assert c.bonus == bonus
        assert c.n_nodes == len(tokens) - 1
        new = [tokens[j] for j in path[1:]] + [bonus]
        last = i == len(trace.cycles) - 1
        # Every cycle but the last commits its whole walk; the last may stop at the limit or end-of-text.
        assert c.committed == len(new) if not last else 1 <= c.committed <= len(new)
        generated += new[: c.committed]
        lengths.append(len(path))
    assert generated == s.generated
    assert trace.new_tokens == len(s.generated)
    assert trace.accept_lengths == lengths
    assert trace.tau == pytest.approx(sum(lengths) / len(lengths))
    summ = trace.summary()
    assert summ.tau == pytest.approx(sum(lengths) / len(lengths)) and summ.cycles == len(lengths)
    assert summ.accept_histogram == dict(sorted(Counter(lengths).items()))
    assert sum(c.committed for c in trace.cycles) == len(s.generated) - 1


@pytest.mark.parametrize("which", range(len(RUNS)), ids=[w + ("-sampled" if kw else "") for w, kw in RUNS])
def test_every_cycle_record_equals_an_independent_walk(runs, which):
    sessions = list(runs.values())[which]
    if RUNS[which][0] == "oracle":
        assert sum(c.accepted >= 2 for s in sessions for c in s.cycles) >= 2, "long paths were rarely accepted"
        assert any(c.accepted_nodes.tolist() != [2 * i for i in range(len(c.accepted_nodes))]
                   for s in sessions for c in s.cycles), "the walk never left the first child"
    for s in sessions:
        check_trace_against_walk(s, s.trace)


def test_saved_and_loaded_records_still_equal_the_walk(runs, tmp_path):
    for k, sessions in enumerate(runs.values()):
        for j, s in enumerate(sessions):
            back = wb.Trace.load(s.trace.save(tmp_path / f"{k}-{j}.trace.jsonl"))
            check_trace_against_walk(s, back)


def test_wire_records_still_equal_the_walk(runs):
    from workbench.serve import wire

    for sessions in runs.values():
        for s in sessions:
            cycles = [wire.cycle_from_wire(wire.loads(wire.dumps(wire.cycle_to_wire(c)))) for c in s.cycles]
            head = wire.loads(wire.dumps(wire.trace_head_to_wire(s.trace)))
            check_trace_against_walk(s, wire.trace_from_wire(head, cycles))


def test_accept_kernel_equals_the_walk_on_random_trees():
    """The vectorized accept walk against the walk above, on random trees and choices (the choices mostly
    follow some child, so long paths are common)."""
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = int(torch.randint(1, 24, (1,), generator=g))
        parents, tokens, depth = [-1], [int(torch.randint(0, 9, (1,), generator=g))], [0]
        for i in range(1, n):
            p = int(torch.randint(0, i, (1,), generator=g))
            used = {tokens[j] for j in range(i) if parents[j] == p}
            free = [t for t in range(9) if t not in used]
            if not free:
                break
            parents.append(p)
            tokens.append(free[int(torch.randint(0, len(free), (1,), generator=g))])
            depth.append(depth[p] + 1)
        n = len(tokens)
        choice = []
        for i in range(n):
            kids = [tokens[j] for j in range(n) if parents[j] == i]
            pick = bool(torch.rand(1, generator=g) < 0.8) and kids
            choice.append(kids[int(torch.randint(0, len(kids), (1,), generator=g))] if pick else
                          int(torch.randint(0, 9, (1,), generator=g)))
        t = torch.tensor
        tree = Tree(t([tokens]), t([parents]), t([depth]), torch.zeros(1, n, dtype=torch.long),
                    torch.zeros(1, n, dtype=torch.float64))
        md = max(depth)
        ct = compile_tree(tree, 5, md)
        acc = accept_walk(tree.tokens, tree.parents, tree.depth, ct.visibility, t([choice]), md)
        path, bonus = walk_stored_tree(tokens, parents, choice)
        assert int(acc.length[0]) == len(path) - 1, trial
        assert acc.index[0, : len(path)].tolist() == path and (acc.index[0, len(path):] == -1).all(), trial
        assert int(acc.bonus[0]) == bonus, trial


# ------------------------------------------------------------------------------------------ K/V in path order
def test_kv_compaction_keeps_rows_in_path_order():
    """Rows labelled by their own index: after compaction row start + i holds the i-th accepted node's row."""
    start, n = 3, 7
    buf = torch.arange(start + n + 2, dtype=torch.float32)[None, None, :, None].repeat(2, 2, 1, 3)
    accepted = torch.tensor([0, 2, 5, 6])
    want = list(range(start)) + [start + int(a) for a in accepted]
    out = compact_kv(buf.clone(), start, accepted)
    assert out[0, 0, :, 0].tolist() == want
    got = compact_kv_(buf.clone(), start, accepted)
    assert got[1, 1, : start + 4, 2].tolist() == want


def plain_kv(eng, ids: list[int]):
    with torch.inference_mode():
        out = eng.models.target(input_ids=torch.tensor([ids]), use_cache=True)
    cache = out.past_key_values
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize("kw", [{}, dict(temperature=0.7, seed=2)], ids=["greedy", "sampled"])
def test_committed_kv_rows_are_in_path_order(eng, kw):
    """After every cycle the target's committed K/V equals a from-scratch forward over the committed tokens
    (row for row, so rows kept in another order fail), on a run where paths of 2+ drafts are accepted."""
    policy, holder = oracle_policy(eng)
    s = eng.session("t5 t9", policy=policy, max_new_tokens=20, **kw)
    holder["s"] = s
    long_paths = 0
    while True:
        c = s.step()
        if s.finished:  # a run that ends inside a cycle keeps the whole path in the cache, not all its tokens
            break
        long_paths += c.accepted >= 2
        committed = s.prompt_ids + s.tokens[:-1]  # the pending bonus is not in the cache yet
        got = s.kv_cache()
        ref = plain_kv(eng, committed)
        assert got[0][0].shape[2] == len(committed)
        for (k, v), (rk, rv) in zip(got, ref):
            torch.testing.assert_close(k, rk, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(v, rv, atol=2e-5, rtol=1e-4)
    assert long_paths > 0, "no cycle accepted two drafts: order within a path was never tested"


# ------------------------------------------------------------------------------------------ the tree and its scores
def test_ddtree_records_are_the_exact_best_prefix_tree(runs, eng):
    """Every DDTree(8) cycle's stored tree equals the independent exact build (``oracles.build_tree_greedy_exact``:
    exact rational sums, a linear scan) over the cycle's recorded draft log-probs, with all 8 nodes when the
    drafter had slots; each node's ``draft_prob`` is its own token's probability at its slot."""
    from ddtree_kernels.oracles import build_tree_greedy_exact

    cycles = [c for s in runs["ddtree{}"] for c in s.cycles if c.draft_topk_tokens.shape[0] > 0]
    assert len(cycles) >= 5
    V = eng.models.target.config.vocab_size
    for c in cycles:
        D, k = c.draft_topk_tokens.shape  # the recorded top-8 per slot holds every token a budget-8 tree can use
        lp = torch.full((D, V), float("-inf")).scatter(1, c.draft_topk_tokens, c.draft_topk_logprobs)
        want = build_tree_greedy_exact(lp, c.root_token, 8)
        assert c.n_nodes == 8 == len(want["tokens"]) - 1
        assert c.tokens.tolist() == want["tokens"] and c.parents.tolist() == want["parents"]
        assert c.depth.tolist() == want["depth"]
        torch.testing.assert_close(c.score.double(), torch.tensor(want["score"], dtype=torch.float64), atol=1e-5,
                                   rtol=0)
        own = [1.0] + [float(lp[d - 1, t].exp()) for t, d in zip(c.tokens.tolist()[1:], c.depth.tolist()[1:])]
        torch.testing.assert_close(c.draft_prob().double(), torch.tensor(own, dtype=torch.float64), atol=1e-5, rtol=1e-4)


def test_inconsistent_records_are_named(runs):
    """``cycle_problem`` (what ``Trace.load`` checks) names a wrong bonus, a wrong accepted length and a path
    that skips the target's choice, on real cycles that accepted drafts."""
    import dataclasses

    from workbench.records.cycle import cycle_problem

    cycles = [c for s in runs["oracle{}"] for c in s.cycles if c.accepted >= 1]
    assert cycles
    for c in cycles:
        assert cycle_problem(c) is None
        other = next(t for t in range(40) if t != c.bonus)
        assert "bonus" in cycle_problem(dataclasses.replace(c, bonus=other))
        short = dataclasses.replace(c, accepted_nodes=c.accepted_nodes[:-1], accepted_tokens=c.accepted_tokens[:-1])
        assert "stops at node" in cycle_problem(short)
