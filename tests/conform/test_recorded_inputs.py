"""Writers record what a forward consumed, read at the forward: a fault between what an engine meant and what
its forward got is named under the input's own contract; where a writer cannot see the forward, its header
names the fields ``intended`` and the report says so beside the verdicts resting on them."""
from __future__ import annotations

import types

import pytest
import torch

import workbench as wb
from workbench.conform.check import conform
from workbench.conform.dump import read_dump

pytestmark = pytest.mark.usefixtures("one_thread")


def mask_leaks_the_last_row(monkeypatch) -> str:
    """The additive mask the verify forward consumes lets the last node see every tree node, though the compiled
    visibility it is built from is right (a mask built wrong downstream of the tree)."""
    from workbench.models.masks import PrefixMask

    original = PrefixMask.tree

    def tree(self, visibility, starts):
        mask = original(self, visibility, starts)  # [B, 1, N, W] additive
        N = visibility.shape[1]
        for b, s in enumerate(starts):
            mask[b, 0, N - 1, s : s + N] = 0
        return mask

    monkeypatch.setattr(PrefixMask, "tree", tree)
    return "visibility"


def test_a_mask_that_leaks_after_the_compiled_tree_is_named_under_visibility(engine, tmp_path, monkeypatch):
    want = mask_leaks_the_last_row(monkeypatch)
    path = tmp_path / "leak.dump"
    engine.session("def parse(line):", policy=wb.DDTree(16), max_new_tokens=10, record_topk=16, dump=path).run()
    monkeypatch.undo()
    head, records = read_dump(path)
    assert head["intended"] == {}  # the workbench's writer reads every input at its forward
    rec = next(r for r in records if r.kind == "cycle")
    assert rec["visibility"].shape[1] == len(rec["tree_tokens"])  # the forward saw the whole prefix
    r = conform(path, models=engine.models)
    assert r.broken[0] == want and "which is not its ancestor" in r.results[want].first["evidence"], str(r)
    assert "intended, not observed" not in str(r)


def test_sglang_features_are_read_where_the_drafter_consumes_them(tmp_path):
    """A stand-in of SGLang's DFlash worker whose append hands its drafter the rows shifted by one (a fault
    between the worker's arguments and the forward): the dump holds what ``project_target_hidden`` consumed, at
    the positions the append ropes, in each request's next record; the header names the verify's fields
    intended."""
    from workbench.conform import sglang_dump

    L, H = 2, 3
    dump = sglang_dump.SglangVerifyDump(tmp_path / "sg.dump", {"vocab_size": 40}, "DFlash", features=(L, H))
    consumed = []

    class Worker:
        draft_model = types.SimpleNamespace(project_target_hidden=lambda x: consumed.append(x) or x[:, :H])

        def _append_target_hidden_to_draft_kv_by_loc(self, *, target_hidden, cache_loc, positions,
                                                     cache_loc_2d=None, commit_lens=None, extend_lens=None):
            self.draft_model.project_target_hidden(target_hidden.roll(1, 0))  # the fault

    w = Worker()
    sglang_dump.install_features(w, dump)
    hidden = torch.arange(5 * L * H, dtype=torch.float32).reshape(5, L * H)
    w._append_target_hidden_to_draft_kv_by_loc(target_hidden=hidden, cache_loc=torch.arange(5),
                                               positions=torch.tensor([7, 8, 9, 3, 4]),
                                               extend_lens=torch.tensor([3, 2]))
    n = 2
    vi = types.SimpleNamespace(draft_token=torch.tensor([1, 2, 5, 6]), positions=torch.tensor([10, 11, 5, 6]),
                               custom_mask=None, retrieve_index=torch.arange(4).reshape(2, 2),
                               retrieve_next_token=torch.tensor([[1, -1], [1, -1]]),
                               retrieve_next_sibling=torch.full((2, n), -1))
    dump.record(vi, [10, 5], request_ids=["a", "b"])
    dump.close()
    head, records = read_dump(tmp_path / "sg.dump")
    cycles = [r for r in records if r.kind == "cycle"]
    assert set(head["intended"]) == {"verify_positions", "visibility"} and head["features"]["form"] == "rows"
    shifted = hidden.roll(1, 0)
    assert torch.equal(consumed[0], shifted)
    assert cycles[0]["draft_context_positions"].tolist() == [7, 8, 9]
    assert torch.equal(cycles[0]["draft_context_features"], shifted[:3])
    assert torch.equal(cycles[1]["draft_context_features"], shifted[3:])


def test_a_tree_dump_fed_by_an_integration_names_its_verify_inputs_intended_unless_told(tmp_path):
    from workbench.conform.vllm_tree_dump import VllmTreeDump

    for name, given, want in (("a", None, {"verify_positions", "visibility"}), ("b", {}, set())):
        VllmTreeDump(tmp_path / name, {"vocab_size": 30}, "DDTree(3)", intended=given).close()
        assert set(read_dump(tmp_path / name)[0]["intended"]) == want
