"""Branching rates from traces and the paired statistics on hand-made data."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workbench.analysis.branching import branching, siblings_to_share, slot_ranks
from workbench.analysis.paired import MIN_PAIRS, paired_ratio
from workbench.records.cycle import Cycle, Trace


def chain_cycle(index, start, root, slots, lps, accepted, bonus) -> Cycle:
    """A DFlash-like cycle: ``slots`` [D, k] candidate ids (stored in any order), ``lps`` their log-probs; the
    chain is each slot's best; ``accepted`` drafted tokens taken, then ``bonus``."""
    ids, lp = torch.tensor(slots), torch.tensor(lps, dtype=torch.float32)
    chain = [int(ids[d][int(torch.argmax(lp[d]))]) for d in range(len(slots))]
    n = len(chain) + 1
    ar = torch.arange(n)
    tokens = torch.tensor([root, *chain])
    return Cycle(index=index, policy="DFlash", start=start, root_token=root, draft_topk_tokens=ids,
                 draft_topk_logprobs=lp, tokens=tokens, parents=ar - 1, depth=ar, rank=torch.zeros(n, dtype=torch.long),
                 score=torch.zeros(n), position_ids=start + ar, visibility=torch.ones(n, n, dtype=torch.bool),
                 retrieve_next_token=ar, retrieve_next_sibling=ar, target_choice=tokens, target_prob=torch.ones(n),
                 accepted_nodes=ar[: accepted + 1], accepted_tokens=tokens[: accepted + 1], bonus=bonus,
                 committed=accepted + 1, stage_seconds={}, forwards=())


def hand_trace() -> Trace:
    # cycle 0: target takes 1 (rank 0), then 5 (rank 1: the chain's 4 misses) -> bonus 5
    c0 = chain_cycle(0, 0, 100, [[3, 1, 2], [4, 5, 6], [7, 8, 9]],
                     [[-2.0, -0.5, -1.0], [-0.1, -1.0, -3.0], [-0.1, -1.0, -3.0]], accepted=1, bonus=5)
    # cycle 1 (from 5): 10 and 13 (rank 0 each), then 99 (not among the candidates) -> bonus 99
    c1 = chain_cycle(1, 2, 5, [[10, 11, 12], [13, 14, 15], [16, 17, 18]],
                     [[-0.1, -1.0, -3.0], [-0.1, -1.0, -3.0], [-0.1, -1.0, -3.0]], accepted=2, bonus=99)
    return Trace(meta={"policy": "DFlash"}, cycles=[c0, c1])


def test_ranks_hit_rates_and_continuation_of_a_hand_built_trace():
    b = branching(hand_trace())
    # stream 100 1 5 10 13 99: cycle 0's slots see 1, 5, 10; cycle 1's see 10, 13, 99
    assert b.ranks.tolist() == [[0, 1, 3], [0, 0, 3]] and b.k == 3
    h = b.hit_rates()
    assert h[0].tolist() == [1, 0, 0, 0] and h[1].tolist() == [0.5, 0.5, 0, 0] and h[2].tolist() == [0, 0, 0, 1]
    fm = b.first_miss()
    assert fm == {"misses": 2, "rank1": 0.5, "rank1_3": 0.5, "beyond": 0.5}
    c = b.continuation()
    # after a spine hit: (c0, d1) -> rank 1, (c1, d1) -> rank 0, (c1, d2) -> beyond
    assert c["spine"]["n"] == 3 and c["spine"]["top1"] == pytest.approx(1 / 3) and c["spine"]["top2"] == pytest.approx(2 / 3)
    # after a sibling hit: (c0, depth 2 at rank 1) -> depth 3 beyond the candidates
    assert c["sibling"] == {"n": 1, "top1": 0.0, "top2": 0.0, "top4": 0.0}
    assert c["by_depth"][0] == {"depth": 1, "spine_n": 2, "spine_top1": 0.5, "sibling_n": 0,
                                "sibling_top1": c["by_depth"][0]["sibling_top1"]}
    assert "rank-1 sibling 50%" in str(b) and "depth" in b.table()


def test_slot_ranks_break_ties_by_token_id_as_the_tree_build():
    ids = np.array([[9, 4, 7]])
    assert slot_ranks(ids, np.array([[-1.0, -1.0, -0.5]]), [4]).tolist() == [1]  # 7 first, then 4 before 9
    assert slot_ranks(ids, np.array([[-1.0, -1.0, -0.5]]), [9]).tolist() == [2]
    assert slot_ranks(ids, np.array([[-1.0, -1.0, -0.5]]), [-1]).tolist() == [-1]
    assert slot_ranks(ids, np.array([[-1.0, -1.0, -0.5]]), [5]).tolist() == [3]


def test_a_chain_run_accepts_exactly_its_rank0_prefix(tiny_engines):
    """Property: in a DFlash trace every accepted slot's target token is the drafter's top-1, and the slot
    after the accepted ones (where known) is not."""
    import workbench as wb

    eng = tiny_engines["l4-h32"]
    tr = eng.session("t1 t2 t3 t4", policy=wb.DFlash(), max_new_tokens=24, record_topk=4).run()
    b = branching(tr)
    drafted = [c for c in tr.cycles if c.draft_topk_tokens.numel()]
    assert b.cycles == len(drafted) > 2
    for row, c in zip(b.ranks, drafted):
        assert (row[: c.accepted] == 0).all()
        if c.accepted < c.draft_topk_tokens.shape[0] and row[c.accepted] >= 0:
            assert row[c.accepted] != 0


def test_branching_refuses_traces_with_nothing_drafted():
    with pytest.raises(ValueError, match="no drafted cycles"):
        branching(Trace(meta={}))
    with pytest.raises(ValueError, match="empty list"):
        branching([])


def test_siblings_to_reach_90_percent_of_the_tree_gain():
    # the tree gains 0.6 tokens per forward; 90% of it is 0.54: two siblings give 0.5, four give 0.6
    assert siblings_to_share({1: 4.3, 2: 4.5, 4: 4.6}, chain_tpf=4.0, tree_tpf=4.6) == 4
    assert siblings_to_share({1: 4.6, 2: 4.6}, 4.0, 4.6) == 1
    assert siblings_to_share({1: 4.1}, 4.0, 5.0) is None
    assert siblings_to_share({1: 4.1}, 4.0, 3.9) is None  # no gain to reach


# ---------------------------------------------------------------------------------------------- paired tests
def test_paired_ratio_p_values_match_the_exact_hand_computed_ones():
    b = [1.0] * 10
    a = [1.1 + 0.01 * i for i in range(10)]  # a wins all 10 pairs
    r = paired_ratio(a, b, "A", "B")
    # all 10 signed ranks positive: exact Wilcoxon and sign test both 2 / 2**10
    assert r.wilcoxon_p == pytest.approx(2 / 1024) and r.sign_p == pytest.approx(2 / 1024)
    assert r.significant and r.order == "A > B" and r.wins == 10 and r.median == pytest.approx(1.145)
    # 8 wins, 2 losses: sign test 2 * P(X >= 8 | n=10) = 2 * 56 / 1024
    a2 = [1.2 + 0.01 * i for i in range(8)] + [0.9, 0.95]
    r2 = paired_ratio(a2, b, "A", "B")
    assert r2.sign_p == pytest.approx(112 / 1024)
    # Wilcoxon: ranks of |log ratio|: the two losses are the smallest (ranks 1, 2), W- = 3; exact two-sided
    # p = 2 * #{subsets of ranks 1..10 with sum <= 3: {}, {1}, {2}, {3}, {1, 2}} / 2**10 = 2 * 5 / 1024
    assert r2.wilcoxon_p == pytest.approx(10 / 1024)
    lo, hi = r2.iqr
    assert lo <= r2.median <= hi and r2.tails == (pytest.approx(0.9), pytest.approx(1.27))


def test_paired_ratio_claims_no_order_on_noise_and_refuses_few_pairs():
    b = [1.0] * 12
    a = [1.3 if i % 2 else 0.8 for i in range(12)]
    r = paired_ratio(a, b, "A", "B")
    assert not r.significant and r.order.startswith("no order (p=")
    with pytest.raises(ValueError, match=f"needs at least {MIN_PAIRS}: give 1 more"):
        paired_ratio(a[:9], b[:9])
    with pytest.raises(ValueError, match="has 3 values and B 2"):
        paired_ratio([1, 2, 3], [1, 2], "A", "B")
    with pytest.raises(ValueError, match="positive and finite"):
        paired_ratio([0.0] + a[1:], b)
    assert math.isclose(paired_ratio(b, b).wilcoxon_p, 1.0)
