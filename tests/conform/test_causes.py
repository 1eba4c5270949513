"""The catalogue of known bug classes (workbench.conform.causes) and each class's reproduction on plain records
(workbench.conform.suspects): every entry is published and reproduces its own suspected input, not a near miss,
and a cycle that cannot tell (the wrong input equals the right one there) is not counted. The planted faults that
each entry must be named for: test_diagnosis.py and test_check.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from workbench.conform import contracts as C
from workbench.conform import suspects as S
from workbench.conform.causes import CAUSES
from workbench.conform.check import ContractResult
from workbench.conform.diagnosis import attempt, clean_before, report_lines

TOKENS, PARENTS = [7, 3, 4, 5, 6], [-1, 0, 0, 1, 3]  # root; two children; a chain under the first
DEPTH = C.depths_from(PARENTS)


class Rec(dict):
    """A cycle record as the suspects read it: fields by name (tensors), its request and step."""

    def __init__(self, request="0", step=1, **fields):
        super().__init__({k: torch.tensor(v) if isinstance(v, list) else v for k, v in fields.items()})
        self.request = request
        self["step"] = step


def sample(rec, start=10, ctx=None, previous=None, batch=None, after=None):
    return SimpleNamespace(rec=rec, ctx=ctx or list(range(start + 1)), start=start, previous=previous,
                           batch=batch or {}, after=after, clean=True)


ENV = SimpleNamespace(hybrid=False, models=SimpleNamespace(mask_token_id=1), tol=C.tolerance("float32"), memo={})


def run(fn, s):
    got = fn(s, ENV)
    return None if got is None else got.match


def test_every_entry_is_published_and_reads_a_contract():
    assert len({(c.name, c.contract) for c in CAUSES}) == len(CAUSES)
    for c in CAUSES:
        assert c.contract in C.CONTRACTS and c.source and c.name, c
        assert all(u in C.CONTRACTS for u in c.upstream), c.name
        assert c.reproduce is not None or c.contract == "drafter output", c.name  # one signature-only entry


def test_each_position_scheme_reproduces_its_own_positions_only():
    prev = Rec(tree_tokens=list(range(9)), accepted_nodes=[0, 2, 5])  # 6 verified nodes rejected
    batch = {0: ("0", 10), 1: ("1", 31)}
    cases = {"offset": [11 + d for d in DEPTH], "index": [10 + i for i in range(5)],
             "row": [31 + d for d in DEPTH], "rejected": [16 + d for d in DEPTH]}
    for key, positions in cases.items():
        s = sample(Rec(verify_positions=positions, tree_parents=PARENTS), previous=prev, batch=batch)
        got = {k: run(S.positions_by(k), s) for k in cases}
        assert got == {k: k == key for k in cases}, (key, got)
    what = S.positions_by("row")(sample(Rec(verify_positions=cases["row"], tree_parents=PARENTS), batch=batch), ENV)
    assert what.what == "positions = request 1's start + depth"
    # nothing recorded to hold it against (no positions, no target values): not tried
    assert S.positions_by("offset", field=False)(sample(Rec(tree_parents=PARENTS)), ENV) is None


def test_each_mask_reproduces_its_own_visibility_and_a_chain_cannot_tell():
    for key, (_, vis) in S.mask_schemes(PARENTS).items():
        s = sample(Rec(visibility=vis, visibility_form="dense", tree_parents=PARENTS, tree_tokens=TOKENS))
        assert {k: run(S.mask_by(k), s) for k in ("previous", "causal", "depth")} == {
            k: k == key for k in ("previous", "causal", "depth")}, key
    chain = [-1, 0, 1, 2]
    s = sample(Rec(visibility=C.ancestor_closure(chain), visibility_form="dense", tree_parents=chain))
    assert S.mask_by("previous")(s, ENV) is None and S.mask_by("causal")(s, ENV) is None


def test_the_commit_bonus_block_context_and_state_reproductions():
    acc = [0, 1, 3]
    rec = Rec(tree_tokens=TOKENS, tree_parents=PARENTS, accepted_nodes=acc, kv_kept_nodes=[0, 1, 2], bonus=5)
    assert run(S.kv_in_tree_order, sample(rec)) is True and run(S.bonus_one_node_early, sample(rec)) is True
    right = Rec(tree_tokens=TOKENS, tree_parents=PARENTS, accepted_nodes=acc, kv_kept_nodes=acc, bonus=9)
    assert run(S.kv_in_tree_order, sample(right)) is None  # named as meant, no output to tell what ran
    assert run(S.bonus_one_node_early, sample(right)) is False
    repeats = Rec(tree_tokens=TOKENS, accepted_nodes=acc, bonus=5, target_choice=[3, 5, 9, 5, 8])
    assert S.bonus_one_node_early(sample(repeats), ENV) is None  # the right bonus repeats the last token too
    assert S.kv_in_tree_order(sample(Rec(tree_tokens=TOKENS, accepted_nodes=[0, 1])), ENV) is None  # path = order
    assert run(S.block_slot0_mask, sample(Rec(draft_block_tokens=[1, 1, 1]))) is True
    assert run(S.block_slot0_mask, sample(Rec(draft_block_tokens=[10, 1, 1]))) is False
    assert run(S.block_positions_shifted, sample(Rec(draft_block_positions=[11, 12, 13]))) is True
    assert run(S.block_positions_shifted, sample(Rec(draft_block_positions=[10, 11, 12]))) is False
    ctx = [100 + i for i in range(11)]
    prev = Rec(context_len=7)
    late = Rec(draft_context_positions=[8, 9], draft_context_tokens=[108, 109])
    assert run(S.context_rows_late, sample(late, ctx=ctx, previous=prev)) is True
    whole = Rec(draft_context_positions=[7, 8, 9], draft_context_tokens=[107, 108, 109])
    assert run(S.context_rows_late, sample(whole, ctx=ctx, previous=prev)) is False
    assert run(S.state_parents_flattened, sample(Rec(state_from=[-1, 0, 1, 2, 3], tree_parents=PARENTS))) is True
    assert run(S.state_parents_flattened, sample(Rec(state_from=[-1, 0, 0, 2, 3], tree_parents=PARENTS))) is False
    assert S.state_parents_flattened(sample(Rec(state_from=[-1, 0, 1], tree_parents=[-1, 0, 1])), ENV) is None


def test_a_candidate_named_only_where_every_cycle_tried_matches_and_upstream_first_blocks_it():
    cause = next(c for c in CAUSES if c.contract == "verify positions" and "another request" in c.name)
    batch = {0: ("0", 10), 1: ("1", 31)}
    hit = sample(Rec(verify_positions=[31 + d for d in DEPTH], tree_parents=PARENTS), batch=batch)
    miss = sample(Rec(verify_positions=[12 + d for d in DEPTH], tree_parents=PARENTS), batch=batch)
    result = ContractResult("verify positions", checked=2, broken=2)
    found = attempt(cause, result, [hit, hit], ENV)
    assert found.reproduced and (found.matched, found.tried) == (2, 2)
    assert not attempt(cause, result, [hit, miss], ENV).reproduced
    results = {n: ContractResult(n) for n in C.CONTRACTS}
    results["verify positions"].first = {"step": 3, "row": 0}
    results["tree"].first = {"step": 2, "row": 0}
    report = SimpleNamespace(results=results)
    assert clean_before(report, "verify positions", ("tree",)) == ["tree"]
    lines = report_lines(["verify positions"], {"verify positions": {"named": [], "tried": [found], "follows": []}},
                         results)
    assert lines[1].startswith("  verify positions: no candidate reproduces it (positions from another request")
    other = attempt(next(c for c in CAUSES if c.contract == "verify positions" and "constant" in c.name), result,
                    [sample(Rec(verify_positions=[11 + d for d in DEPTH], tree_parents=PARENTS))], ENV)
    both = {"verify positions": {"named": [found, other], "tried": [found, other], "follows": []}}
    assert other.reproduced and "reproduce it alike" in report_lines(["verify positions"], both, results)[-1]
    odd = sample(Rec(verify_positions=[1], tree_parents=PARENTS), batch={1: ("1", "a start that is no number")})
    broken = attempt(cause, result, [odd], ENV)
    assert broken.tried == 0 and broken.what.startswith("could not run: TypeError")  # never stops the check


@pytest.mark.parametrize("cause", [c for c in CAUSES if c.over_facts], ids=lambda c: c.name[:40])
def test_a_features_cause_is_reproduced_by_the_contracts_own_row_comparison(cause):
    label = {"the target-layer index off by one": "layer:-1", "the drafter's features handed over a row (or more) "
             "off": "shift:1", "the drafter's features read before the target's final norm": "prenorm:0",
             "hidden states not compacted to the accepted path": "rejected"}[cause.name]
    result = ContractResult("drafter features", checked=2, broken=2,
                            facts=[{"explained": {label: 4}}, {"explained": {label: 2}}])
    assert cause.fits(result, False) and attempt(cause, result, [], ENV).reproduced
    mixed = ContractResult("drafter features", checked=1, broken=1, facts=[{"explained": {label: 2, "unexplained": 2}}])
    assert not attempt(cause, mixed, [], ENV).reproduced
