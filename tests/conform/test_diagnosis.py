"""Differential diagnosis (workbench.conform.diagnosis) on planted faults: each bug class the catalogue reproduces
is named first by its own contract and reproduced by its own cause, single and batched; and on a clean run no
candidate's reproduction matches the engine's records on any cycle. (The catalogue's entries on plain records:
test_causes.py; the faults of the other contracts: test_check.py.)"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import workbench as wb
from workbench.conform import check, replay
from workbench.conform.causes import CAUSES
from workbench.conform.check import conform
from workbench.conform.diagnosis import Env

sys.path.insert(0, str(Path(__file__).parent))
import faults  # noqa: E402  (tests/conform/faults.py: test-only)
from test_check import PROMPTS, assert_cause  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
NEW = 6
BATCH = [PROMPTS[0], "for i in range(10):\n    total = total + values[i] * weights[i] - offsets[i]\n"]


@pytest.fixture(scope="module")
def hybrid_engine():
    return wb.load("hybrid")


def planted_run(engine, fault: str, path: Path, monkeypatch, batch: int = 1):
    """A short DDTree(16) run with ``fault`` planted, checked on the same models fault-free. -> (report, contract)."""
    want = getattr(faults, fault)(monkeypatch)
    if batch == 1:
        engine.session(PROMPTS[0], policy=wb.DDTree(16), max_new_tokens=NEW, record_topk=16, dump=path).run()
    else:  # prompts of lengths far apart: one row's start is not another's plus a small constant
        engine.batch_session(BATCH[:batch], wb.DDTree(16), max_new_tokens=NEW, record_topk=16, dump=path).run()
    monkeypatch.undo()
    return conform(path, models=engine.models), want


@pytest.mark.parametrize("fault,batch", [("positions_counting_rejected", 1), ("positions_from_first_row", 2),
                                         ("mask_previous", 1), ("mask_previous", 2), ("mask_causal", 1),
                                         ("mask_depth", 1), ("bonus_one_node_early", 1), ("drafter_block_causal", 1),
                                         ("drafter_block_causal", 2), ("drafter_block_shifted", 1),
                                         pytest.param("positions_from_first_row", -2, marks=pytest.mark.slow)])
def test_a_diagnosed_fault_is_named_first_and_reproduced_by_its_own_cause(fault, batch, engine, hybrid_engine,
                                                                           tmp_path, monkeypatch):
    """(batch < 0: that many rows on the hybrid pair.)"""
    e = engine if batch > 0 else hybrid_engine
    r, want = planted_run(e, fault, tmp_path / "run.dump", monkeypatch, abs(batch))
    assert r.broken and r.broken[0] == want, str(r)
    assert_cause(r, fault)
    named = r.diagnosis[want]["named"][0]
    assert named.tried >= 1 and named.matched == named.tried and "reproduced: " in str(r), str(r)
    as_json = json.loads(json.dumps(r.to_dict()))["diagnosis"][want]["named"][0]
    assert as_json["cause"] == faults.CAUSE[fault] and as_json["reproduced"] and as_json["source"]


def test_a_mask_fault_without_its_visibility_in_the_dump_is_reproduced_from_the_logits(engine, tmp_path,
                                                                                      monkeypatch):
    """A dump without the verify's visibility (a writer that records none, or records the mask it meant): the leak
    shows first in the target's logits, and the diagnosis names the mask whose forward gives the engine's logits."""
    from test_check import rewrite

    faults.mask_previous(monkeypatch)
    path = tmp_path / "run.dump"
    engine.session(PROMPTS[0], policy=wb.DDTree(16), max_new_tokens=NEW, record_topk=16, dump=path).run()
    monkeypatch.undo()
    bare = rewrite(path, tmp_path / "bare.dump", lambda o: [o.pop(k, None) for k in ("visibility", "visibility_form")])
    r = conform(bare, models=engine.models)
    assert r.broken[0] == "target logits", str(r)
    assert [c.name for c in r.causes["target logits"]] == [faults.CAUSE["mask_previous"]], str(r)


def test_the_bonus_missing_from_slot_0_without_the_block_in_the_dump_is_reproduced_from_the_drafter(engine,
                                                                                                   tmp_path,
                                                                                                   monkeypatch):
    """A dump without the drafter's block (a writer that records none): the drafter's output breaks first, and the
    diagnosis names the block whose forward gives the engine's output, the mask token in slot 0."""
    from test_check import rewrite

    faults.bonus_missing_from_block(monkeypatch)
    path = tmp_path / "run.dump"
    engine.session(PROMPTS[0], policy=wb.DDTree(16), max_new_tokens=NEW, record_topk=16, dump=path).run()
    monkeypatch.undo()
    bare = rewrite(path, tmp_path / "bare.dump", lambda o: [o.pop(k, None) for k in ("draft_block_tokens",
                                                                                     "draft_block_positions")])
    r = conform(bare, models=engine.models)
    assert r.broken[0] == "drafter output", str(r)
    assert [c.name for c in r.causes["drafter output"]] == [faults.CAUSE["bonus_missing_from_block"]], str(r)


@pytest.mark.parametrize("pair", ["dense", pytest.param("hybrid", marks=pytest.mark.slow)])
def test_a_clean_run_is_reproduced_by_no_candidate_on_any_cycle(pair, engine, hybrid_engine, tmp_path, monkeypatch):
    """The first cycles of a clean batched run kept as samples of every contract: no candidate's reproduction equals
    the engine's records (a reproduction that cannot tell on a cycle says so and is not counted)."""
    engine = engine if pair == "dense" else hybrid_engine
    path = tmp_path / "clean.dump"
    engine.batch_session(BATCH, wb.DDTree(16), max_new_tokens=4, record_topk=16,
                         dump=path).run()
    kept = {}
    verdict = replay.Replay.verdict

    def keep_every(self, name, rec, problem, cost, facts=None):
        if len(self.samples[name]) < 4:
            self.samples[name].append(self._now)
        return verdict(self, name, rec, problem, cost, facts)

    def capture(report, rp):
        kept["replay"] = rp
        return {}

    monkeypatch.setattr(replay.Replay, "verdict", keep_every)
    monkeypatch.setattr(check, "diagnose", capture)
    r = conform(path, models=engine.models)
    rp = kept["replay"]
    assert r.broken == [] and rp.samples["verify positions"]
    env = Env(rp.models, rp.tol, rp.hybrid, rp.ref, {})
    for kept_cycles in rp.samples.values():  # each cycle as the commit blamed for its request's next root
        for i, a in enumerate(kept_cycles):
            a.after = next((b for b in kept_cycles[i + 1:] if b.rec.request == a.rec.request and b.ctx), None)
    tried = 0
    for cause in CAUSES:
        if cause.reproduce is None or cause.over_facts:
            continue
        for sample in rp.samples[cause.contract]:
            got = cause.reproduce(sample, env)
            tried += got is not None
            assert got is None or not got.match, (cause.name, sample.rec["step"], got)
    assert tried >= 20


def test_the_reproductions_forwards_are_the_path_oracle_at_the_right_inputs(tiny_engines):
    """At the right positions, mask, K/V rows and state, each reproduction forward gives the path oracle's logits
    (so that a match under a suspected input is that input's, not the forward's own difference)."""
    from workbench.conform import contracts as C
    from workbench.conform import reproduce as R
    from workbench.conform.check import chain_logits

    m = tiny_engines["l4-h32"].models
    ctx, tokens, parents = [5, 9, 3, 7, 2], [4, 8, 9, 10, 12], [-1, 0, 0, 1, 3]
    want = chain_logits(m.target, ctx, tokens, parents)
    positions = [len(ctx) + d for d in C.depths_from(parents)]
    assert (R.logits_at(m.target, ctx, tokens, parents, positions) - want).abs().max() < 1e-4
    assert (R.masked_logits(m.target, ctx, tokens, positions, C.ancestor_closure(parents)) - want).abs().max() < 1e-4
    caches = R.PathCaches(m.target, ctx, tokens, parents)
    after = R.root_after(caches, [0, 1, 3], 3, 7, len(ctx) + 3)  # the path 0, 1, 3 kept, then root 7
    assert (after - chain_logits(m.target, ctx + [4, 8, 10], [7], [-1])[0]).abs().max() < 1e-4
    ids = want.topk(3).indices
    assert R.agreement(ids, want.gather(1, ids), want, C.tolerance("float32"))[0]
    assert not R.agreement(ids, want.gather(1, ids) + 0.1, want, C.tolerance("float32"))[0]
