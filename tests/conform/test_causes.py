"""The catalogue of known bug classes (workbench.conform.causes): every entry matches its own signature, not a
near miss, and not when a contract upstream of it broke first; a broken contract no entry matches is reported
as "no known cause matches". (The planted faults that leave each signature: test_check.py.)"""
from __future__ import annotations

import pytest

from workbench.conform import contracts as C
from workbench.conform.causes import CAUSES, match_causes, report_lines
from workbench.conform.check import ContractResult

# Per entry: (evidence of its broken cycles that matches, a near miss that must not).
EXAMPLES = {
    "the bonus token missing from the block's slot 0 (the mask token instead)":
        ([{"slot0_mask": True, "block_offset": 0}] * 2, [{"slot0_mask": True, "block_offset": 0},
                                                         {"slot0_mask": False, "block_offset": 0}]),
    "the drafter's block at shifted positions (RoPE phase skew)":
        ([{"slot0_mask": False, "block_offset": 1}], [{"slot0_mask": False, "block_offset": None}]),
    "the target-layer index off by one":
        ([{"explained": {"layer:-1": 20}}, {"explained": {"layer:-1": 8}}],
         [{"explained": {"layer:-1": 4, "unexplained": 4}}]),
    "the drafter's features handed over a row (or more) off":
        ([{"explained": {"shift:-1": 8}}], [{"explained": {"shift:-1": 4, "shift:1": 4}}]),
    "the drafter's features read before the target's final norm":
        ([{"explained": {"prenorm:0": 5}}], [{"explained": {"prenorm:2": 5}}]),
    "hidden states not compacted to the accepted path":
        ([{"explained": {"rejected": 1}}, {"explained": {"rejected": 2, "shift:1": 1}}],
         [{"explained": {"shift:1": 3}}]),
    "a drafter that does not share the target's lm_head / embeddings":
        ([{"top1_agree": 0.0, "slots": 15}, {"top1_agree": 0.2, "slots": 15}], [{"top1_agree": 0.8, "slots": 15}]),
    "a flat position / tree node off by one":
        ([{"offset": 1, "by_index": False}], [{"offset": 2, "by_index": False}]),
    "tree positions by flat node index, not depth":
        ([{"offset": None, "by_index": True}], [{"offset": None, "by_index": False}]),
    "stale parent indices on a hybrid target":
        ([{"flattened": True, "wrong": 5}], [{"flattened": False, "wrong": 1}]),
    "the recurrent state committed from the wrong node":
        ([{"state": True, "hybrid": True, "kept_as_accepted": True}],
         [{"state": True, "hybrid": True, "kept_as_accepted": False}]),
    "K/V rows not compacted to the accepted path":
        ([{"state": True, "hybrid": False, "kept_as_accepted": True}],
         [{"state": True, "hybrid": True, "kept_as_accepted": True}]),
}


class Report:
    """The parts of a ConformReport the catalogue reads: each contract's result, and the broken ones in order."""

    def __init__(self, broken: dict):
        self.results = {name: ContractResult(name) for name in C.CONTRACTS}
        for step, (name, facts) in enumerate(broken.items()):
            r = self.results[name]
            r.checked = r.broken = len(facts)
            r.facts = list(facts)
            r.first = {"request": "0", "cycle": step, "step": step, "row": 0, "evidence": "..."}
        self.broken = list(broken)


def test_every_entry_has_an_example_and_a_public_reference():
    assert sorted(EXAMPLES) == sorted(c.name for c in CAUSES)
    for c in CAUSES:
        assert c.contract in C.CONTRACTS and c.reference and c.signature, c.name
        assert all(u in C.CONTRACTS for u in c.upstream), c.name


@pytest.mark.parametrize("cause", CAUSES, ids=lambda c: c.name[:40])
def test_each_entry_matches_its_signature_only(cause):
    hit, miss = EXAMPLES[cause.name]
    assert cause in match_causes(Report({cause.contract: hit}))[cause.contract]
    assert cause not in match_causes(Report({cause.contract: miss}))[cause.contract]
    if cause.upstream:  # an input that broke first explains this evidence: the cause is the input's, not this
        before = {cause.upstream[0]: [{}], cause.contract: hit}
        assert cause not in match_causes(Report(before))[cause.contract]
        after = {cause.contract: hit, cause.upstream[0]: [{}]}
        assert cause in match_causes(Report(after))[cause.contract]


def test_a_broken_contract_no_entry_matches_says_so():
    report = Report({"visibility": [{}], "tree": [{}]})
    causes = match_causes(report)
    assert causes == {"visibility": [], "tree": []}
    assert report_lines(report.broken, causes)[1:] == ["  visibility: no known cause matches",
                                                       "  tree: no known cause matches"]
