"""The drafter-input comparison of the comparison report, on plain tensors: each planted difference is named
by its own input and by no other."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from workbench.adapters.drafter_inputs import aligned_context, compare_inputs

MASK = 7


def _proposal(tokens, positions, rejected=0):
    """A verify's context rows: the committed ones, then ``rejected`` drafts the drafter must not see."""
    tok = torch.tensor(list(tokens) + [99] * rejected)
    pos = torch.tensor(list(positions) + list(range(positions[-1] + 1, positions[-1] + 1 + rejected)))
    return SimpleNamespace(context_tokens=tok, context_positions=pos, context_features=torch.randn(len(tok), 4),
                           context_states=None)


def _run(shift_ctx=0, drop=None, block_shift=0, block_token=None):
    committed = list(range(100, 120))  # positions 0..19; cycle starts 8, 12, 17 (the root at 17)
    starts = [8, 12, 17]
    cuts = [(0, 8), (8, 12), (12, 17)]
    proposals = []
    for i, (a, b) in enumerate(cuts):
        pos = [p + shift_ctx for p in range(a, b)]
        tok = committed[a:b]
        if drop is not None and a <= drop < b:
            tok = tok[: drop - a] + [5] + tok[drop - a + 1:]
        proposals.append(_proposal(tok, pos, rejected=3 if i else 0))
    aligned, note = aligned_context(proposals, starts)
    start, k = starts[-1], 4
    block = torch.tensor([committed[start]] + [MASK] * k)
    if block_token is not None:
        block[block_token] = 3
    bpos = torch.arange(start, start + k + 1) + block_shift
    checks = compare_inputs(committed[: start + 1], start, k, MASK, aligned, block, bpos)
    return {c.name: c for c in checks}, aligned, note


def test_clean_inputs_are_all_equal_and_rejected_rows_are_dropped():
    checks, aligned, note = _run()
    assert note == "" and aligned["context_tokens"].shape[0] == 17 and aligned["context_features"].shape[0] == 17
    assert all(c.equal and c.compared > 0 for c in checks.values()), checks


def test_each_input_difference_is_named_by_its_own_input_only():
    for kw, name, first in ((dict(shift_ctx=1), "context positions", "row 0: production 1, reference 0"),
                            (dict(drop=9), "context tokens", "position 9: production 5, reference 109"),
                            (dict(block_shift=1), "block positions", "slot 0: production 18, reference 17"),
                            (dict(block_token=2), "block tokens", f"slot 2: production 3, reference {MASK}")):
        checks, _, _ = _run(**kw)
        bad = [n for n, c in checks.items() if not c.equal]
        assert bad == [name], (kw, bad)
        assert checks[name].first == first, checks[name]


def test_an_input_not_recorded_says_so_and_is_not_equal():
    committed = list(range(10))
    aligned = {"context_tokens": torch.tensor(committed[:5]), "context_positions": torch.arange(5)}
    checks = {c.name: c for c in compare_inputs(committed[:6], 5, 3, MASK, aligned, None, torch.arange(5, 9))}
    assert not checks["block tokens"].equal and "not recorded" in checks["block tokens"].missing
    assert checks["block positions"].equal and checks["context tokens"].equal


def test_a_context_shorter_than_the_committed_one_is_named():
    proposals = [_proposal([1, 2, 3], [0, 1, 2]), _proposal([4], [3])]
    aligned, note = aligned_context(proposals, [3, 5])  # the second verify committed 2 rows but handed over 1
    assert "cycle 1: 1 of 2 rows" in note
    checks = {c.name: c for c in compare_inputs([1, 2, 3, 4, 5, 6], 5, 2, MASK, aligned, None, None)}
    assert not checks["context tokens"].equal and "production has 4 values, the reference 5" in checks["context tokens"].first


def test_a_table_the_report_could_not_fill_says_why_in_the_verdict():
    from workbench.adapters.compare import Divergence

    inputs = [{"input": "block tokens", "compared": 0, "differ": 0, "first": "", "equal": False,
               "missing": "not recorded by the production engine's hooks"}]
    d = Divergence(0, 3, 40, [], [], [], None, inputs, {"layers": "the hooks kept no per-layer tensors"})
    (line,) = d.verdict()
    assert "not compared: block tokens, the layers (the hooks kept no per-layer tensors)" in line
