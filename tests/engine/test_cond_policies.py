"""The learned-head policies (CondTree, CondChain): lossless on the embedded pairs (batch 1 and 8, static shapes),
reachable by every spelling, refused in one line on a head trained on another pair before any decode; the draft
stage hands them the drafter's per-slot hidden state (the LM head's input, row for row); their increments are the
head's q under each parent, laid out as the rank-class tree build reads them."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.engine.policies import CondChain, CondTree, from_wire, parse_policy, registered, to_wire
from workbench.engine.policies.cond_head import SHIPPED, CondHeadError, conditioned_increments, load_head
from workbench.serve import wire
from shared_checks import assert_greedy_equals_ar

NEW = [CondTree(16), CondTree(8), CondChain(8), CondChain(3)]


@pytest.fixture(scope="module")
def hybrid():
    return wb.load("hybrid")


def test_spellings_round_trip():
    assert {"condtree", "condchain"} <= set(registered())
    for p in NEW + [CondTree(8, head="hybrid"), CondChain(4, head="dense")]:
        assert parse_policy(str(p)) == p and parse_policy(repr(p)) == p, p
        assert from_wire(to_wire(p)) == p
        assert wire.policy_from_wire(wire.loads(wire.dumps(wire.policy_to_wire(p)))) == p
    assert parse_policy("condtree:24") == CondTree(24) and parse_policy("condchain:4") == CondChain(4)
    assert parse_policy("CondTree(8, head=Hybrid)") == CondTree(8, head="hybrid")
    with pytest.raises(ValueError, match="budget=0 must be an integer") as e:
        parse_policy("condtree:0")
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------ lossless
def greedy_equals_ar(engine, prompts, new: int, batch: bool):
    block = engine.models.block_size
    assert_greedy_equals_ar(engine, prompts, NEW, new, batch=batch, node_cap=lambda p: p.static_nodes(block) - 1)


def test_greedy_equals_ar_dense_batch_1(engine, eval_prompts):
    greedy_equals_ar(engine, [it["prompt"] for it in eval_prompts[:2]], 32, batch=False)


@pytest.mark.slow  # a few seconds on an idle machine, minutes on a loaded one
def test_greedy_equals_ar_dense_batch_8(engine, eval_prompts):
    greedy_equals_ar(engine, [it["prompt"] for it in eval_prompts[:8]], 24, batch=True)


@pytest.mark.slow
def test_greedy_equals_ar_hybrid_batch_1(hybrid, eval_prompts):
    greedy_equals_ar(hybrid, [it["prompt"] for it in eval_prompts[2:4]], 24, batch=False)


def test_static_shapes_are_lossless(engine, eval_prompts):
    prompt = eval_prompts[0]["prompt"]
    ref = engine.session(prompt, policy=wb.AR(), max_new_tokens=24)
    ref.run()
    for policy in (CondTree(8), CondChain(8)):
        s = engine.session(prompt, policy=policy, max_new_tokens=24, static_shapes=True)
        s.run()
        assert s.tokens == ref.tokens, policy


# ------------------------------------------------------------------------------------------ the hidden state
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_the_draft_carries_each_slots_hidden_state(engine, eval_prompts, static):
    """log_softmax(LM head(hidden)) is the draft's log-probs, slot for slot and row for row (a batch too)."""
    head = engine.models.target.lm_head
    seen = []
    b = engine.batch_session([it["prompt"] for it in eval_prompts[:3]], policy=wb.DFlash(), max_new_tokens=8,
                             static_shapes=static)
    b.step()  # the prefill's context is drafted from at the next cycle too
    b.step(hooks=[("draft", lambda d, h: seen.append(d))])
    s = engine.session(eval_prompts[0]["prompt"], policy=wb.DFlash(), max_new_tokens=8, static_shapes=static)
    s.step(hooks=[("draft", lambda d, h: seen.append(d))])
    assert len(seen) == 4
    for d in seen:
        assert d.hidden is not None and d.hidden.shape[:2] == d.logprobs.shape[:2]
        with torch.no_grad():
            again = torch.log_softmax(head(d.hidden).float(), dim=-1)
        assert torch.allclose(again, d.logprobs, atol=1e-4)


# ------------------------------------------------------------------------------------------ the head
def test_increments_are_the_heads_q_under_each_parent():
    """[b, d, j, c]: candidate j of slot d under the parent that is candidate c of slot d - 1 (slot 0: the root)."""
    head = load_head("dense")
    g = torch.Generator().manual_seed(0)
    bs, D, K, k = 2, 4, head.K, 5
    H = head.arrays["P"].shape[1]
    hidden = torch.randn(bs, D, H, generator=g)
    topv = torch.sort(torch.log_softmax(torch.randn(bs, D, K, generator=g), -1) - 1.0, dim=-1, descending=True).values
    topi = torch.randint(0, 4096, (bs, D, K), generator=g)
    roots = torch.tensor([7, 11])
    inc = conditioned_increments(head, hidden, topv, topi, roots, k)
    assert inc.shape == (bs, D, k, k)
    for b in range(bs):
        for d in range(D):
            for c in range(k):
                prev, bucket = (roots[b], 0) if d == 0 else (topi[b, d - 1, c], min(c, 3) + 1)
                q = head.log_q(hidden[b, d], topv[b, d], topi[b, d], torch.tensor([int(prev)]), torch.tensor([bucket]))
                assert torch.allclose(inc[b, d, :, c].float(), q[0, :k], atol=1e-5), (b, d, c)
    assert (inc <= 0).all()


def doctored(tmp_path, change) -> str:
    with np.load(SHIPPED["dense"]) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("meta")))
    change(meta)
    p = tmp_path / "head.npz"
    np.savez(p, meta=np.array(json.dumps(meta)), **arrays)
    return str(p)


@pytest.mark.parametrize("change,msg", [
    (lambda m: m["pair"].update(tokenizer="0000000000000000"), "its tokenizer is 0000000000000000, this pair's"),
    (lambda m: m["pair"]["drafter"].update(weights="0123456789abcdef"), "its drafter is qwen3, 2 layers x 256, "
                                                                       "weights 0123456789abcdef"),
    (lambda m: m.update(format="something else"), "is not a version-1 conditioned head"),
])
def test_a_head_for_another_pair_is_refused_in_one_line_before_any_decode(engine, tmp_path, change, msg):
    path = doctored(tmp_path, change)
    for policy in (CondTree(8, head=path), CondChain(8, head=path)):
        with pytest.raises(CondHeadError, match=msg) as e:
            engine.session("def f():\n    ", policy=policy, max_new_tokens=8)
        assert "\n" not in str(e.value) and isinstance(e.value, ValueError)


def test_each_pair_gets_its_own_head_and_not_the_others(engine, hybrid):
    a = engine.session("def parse(line):\n    ", policy="condtree:8", max_new_tokens=8)
    b = hybrid.session("def parse(line):\n    ", policy="condtree:8", max_new_tokens=8)
    assert a.policy == b.policy == CondTree(8) and str(a.policy) == "CondTree(8)"
    assert a.policy.head_data().path == str(SHIPPED["dense"]) and b.policy.head_data().path == str(SHIPPED["hybrid"])
    with pytest.raises(CondHeadError, match="was trained on another pair: its drafter is") as e:
        hybrid.session("x = 1\n", policy=CondTree(8, head="dense"), max_new_tokens=8)
    assert "\n" not in str(e.value)


def test_the_chain_has_the_most_expected_accepted_tokens():
    """Against every chain of a small block: E = q1 (1 + q2 (1 + ...)), q under each chosen parent."""
    import itertools

    from workbench.engine.policies.cond_chain import longest_chain
    from workbench.engine.policies.pair_chain import best_chain

    g = torch.Generator().manual_seed(3)
    bs, D, k = 60, 6, 3
    inc = torch.log(torch.rand(bs, D, k, k, generator=g, dtype=torch.float64) ** 3)

    def expected(b, ranks):
        total, p, parent = 0.0, 1.0, 0
        for d, r in enumerate(ranks):
            p *= float(inc[b, d, r, parent].exp())
            total, parent = total + p, r
        return total

    ranks, score = longest_chain(inc)
    for b in range(bs):
        best = max(expected(b, c) for c in itertools.product(range(k), repeat=D))
        assert abs(expected(b, ranks[b].tolist()) - best) < 1e-12
        steps = [float(inc[b, d, r, 0 if d == 0 else ranks[b, d - 1]]) for d, r in enumerate(ranks[b].tolist())]
        assert torch.allclose(score[b], torch.tensor(steps, dtype=torch.float64).cumsum(0))
    # the Viterbi chain (the likeliest to be accepted whole) is another: 0.95 then 0.3 beats 0.5 then 0.99
    two = torch.log(torch.tensor([[[[0.95, 0.95], [0.5, 0.5]], [[0.3, 0.99], [0.01, 0.01]]]], dtype=torch.float64))
    assert longest_chain(two)[0].tolist() == [[0, 0]] and best_chain(two)[0].tolist() == [[1, 0]]


def test_the_host_scoring_is_the_heads_formula():
    """NumPy's increments (a CPU draft's host build) equal the tensor ones, row for row, on random states."""
    from workbench.engine.policies.cond_head import host_increments

    head = load_head("hybrid")
    g = torch.Generator().manual_seed(1)
    bs, D, K = 3, 6, head.K
    hidden = torch.randn(bs, D, head.arrays["P"].shape[1], generator=g)
    topv = torch.sort(torch.log_softmax(torch.randn(bs, D, 64, generator=g) * 2, -1), dim=-1, descending=True).values
    topv, topi = topv[..., :K], torch.randint(0, 4096, (bs, D, K), generator=g)
    roots = torch.tensor([5, 6, 7])
    for k in (1, 5, K):
        want = conditioned_increments(head, hidden, topv, topi, roots, k)
        got = host_increments(head, hidden.numpy(), topv.numpy(), topi.numpy(), roots.numpy(), k)
        assert got.shape == want.shape and np.allclose(got, want.numpy(), atol=2e-5), k


def test_a_cpu_build_reads_a_bfloat16_drafters_states_as_the_device_build_does():
    from workbench.engine.stages.draft import Draft

    policy = CondTree(8).bound_to(load_head("dense"))
    g = torch.Generator().manual_seed(2)
    lp = torch.log_softmax(torch.randn(2, 15, 4096, generator=g) * 2, -1)
    hidden = torch.randn(2, 15, 256, generator=g).bfloat16()
    host = policy.build_tree(Draft(lp, None, hidden=hidden), torch.tensor([3, 4]), False)
    device = policy.build_tree(Draft(lp, None, hidden=hidden), torch.tensor([3, 4]), True)
    assert torch.equal(host.tokens, device.tokens) and torch.equal(host.parents, device.parents)
