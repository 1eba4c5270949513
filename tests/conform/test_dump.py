"""The cycle dump format: round trip, streaming, a cut-short file, missing and unknown fields, foreign files."""
from __future__ import annotations

import json

import pytest
import torch

from workbench.conform.dump import (CYCLE_FIELDS, DUMP_FORMAT, DumpFileError, DumpWriter, make_header, read_dump)


def header():
    return make_header({"name": "test", "version": "0"}, {"target": "t", "draft": "d", "vocab_size": 50,
                                                         "block_size": 4}, "DDTree(3)", {"temperature": 0.0})


def cycle_fields(g: torch.Generator, n: int = 4) -> dict:
    parents = torch.tensor([-1, 0, 0, 1][:n])
    return dict(
        cycle=0, row=0, rows=1, policy="DDTree(3)", context_len=7, root_token=5,
        draft_context_tokens=torch.randint(0, 50, (7,), generator=g), draft_context_positions=torch.arange(7),
        draft_block_tokens=torch.tensor([5, 49, 49, 49]), draft_block_positions=torch.arange(7, 11),
        draft_context_features=torch.randn(7, 2 * 6, generator=g).to(torch.bfloat16),  # 2 layers of 6, side by side
        draft_topk_ids=torch.randint(0, 50, (3, 2), generator=g), draft_topk_values=torch.randn(3, 2, generator=g),
        draft_values="logprobs", tree_tokens=torch.randint(0, 50, (n,), generator=g), tree_parents=parents,
        tree_depths=torch.tensor([0, 1, 1, 2][:n]), verify_ids=torch.randint(0, 50, (n,), generator=g),
        verify_positions=7 + torch.tensor([0, 1, 1, 2][:n]), visibility_form="dense",
        visibility=torch.rand(n, n, generator=g) > 0.5, target_topk_ids=torch.randint(0, 50, (n, 2), generator=g),
        target_topk_values=torch.randn(n, 2, generator=g, dtype=torch.float64).to(torch.bfloat16),
        target_choice=torch.randint(0, 50, (n,), generator=g), accepted_nodes=torch.tensor([0, 1]), bonus=3,
        committed_tokens=torch.tensor([8, 3]), kv_kept_nodes=torch.tensor([0, 1]), next_context_len=9, state_from=torch.tensor([-1, 0, 0, 1][:n]),
    )


def test_round_trip_every_field_bit_for_bit(tmp_path):
    g = torch.Generator().manual_seed(0)
    rows = [cycle_fields(g) for _ in range(3)]
    with DumpWriter(tmp_path / "run.dump", header()) as w:
        w.request("r0", prompt_ids=torch.arange(7), first_token=5, policy="DDTree(3)", temperature=0.0, seed=1)
        for step, f in enumerate(rows):
            w.cycle("r0", step, **f)
    head, recs = read_dump(tmp_path / "run.dump")
    assert head["format"] == DUMP_FORMAT and head["pair"]["vocab_size"] == 50
    got = list(recs)
    assert recs.complete and recs.truncated is None and recs.count == 4
    assert got[0].kind == "request" and got[0]["prompt_ids"].tolist() == list(range(7))
    for step, (want, rec) in enumerate(zip(rows, got[1:])):
        assert rec["step"] == step
        for name, v in want.items():
            r = rec[name]
            if isinstance(v, torch.Tensor):  # bfloat16 comes back as float32, exactly
                want_dtype = torch.float32 if v.dtype == torch.bfloat16 else v.dtype
                assert r.dtype == want_dtype and torch.equal(r, v.to(want_dtype)), name
            else:
                assert r == v, name
        # every documented field but the alternatives this writer left out is there
        assert rec.missing() == ["sglang_mask_mode", "fi_mask_indptr", "fi_kv_len"], rec.missing()


def test_streaming_each_record_readable_before_close(tmp_path):
    g = torch.Generator().manual_seed(1)
    w = DumpWriter(tmp_path / "run.dump", header())
    for step in range(3):
        w.cycle("a", step, **cycle_fields(g))
        _, recs = read_dump(tmp_path / "run.dump")
        assert [r["step"] for r in recs] == list(range(step + 1))
        assert not recs.complete and recs.truncated is None  # stopped early, not damaged
    w.close()
    _, recs = read_dump(tmp_path / "run.dump")
    assert len(list(recs)) == 3 and recs.complete


@pytest.mark.parametrize("cut", [1, 17, -2])
def test_truncated_file_readable_up_to_last_whole_record(tmp_path, cut):
    g = torch.Generator().manual_seed(2)
    with DumpWriter(tmp_path / "run.dump", header()) as w:
        for step in range(4):
            w.cycle("a", step, **cycle_fields(g))
    lines = (tmp_path / "run.dump").read_bytes().split(b"\n")
    # keep the header and two whole records, then part of the third
    part = lines[3][:cut] if cut > 0 else lines[3][:cut]
    (tmp_path / "cut.dump").write_bytes(b"\n".join(lines[:3]) + b"\n" + part)
    _, recs = read_dump(tmp_path / "cut.dump")
    assert [r["step"] for r in recs] == [0, 1]
    assert recs.truncated and "cut short" in recs.truncated and "2 whole records" in recs.truncated
    assert not recs.complete


def test_missing_fields_named_by_group(tmp_path):
    with DumpWriter(tmp_path / "run.dump", header()) as w:
        w.cycle("a", 0, tree_tokens=[1, 2], tree_parents=[-1, 0], sglang_custom_mask=torch.ones(4, dtype=torch.bool),
                sglang_mask_mode="QLEN_ONLY")
    rec = next(iter(read_dump(tmp_path / "run.dump")[1]))
    miss = rec.missing()
    assert "tree_depths" in miss and "tree_tokens" not in miss
    assert not any(m.startswith("visibility (") for m in miss)  # the SGLang form stands for the group
    assert "draft (draft_topk_ids or draft_topk_values or draft_logits)" in miss
    assert "target (target_topk_ids or target_topk_values or target_logits)" in miss
    assert rec.get("tree_depths") is None


def test_writer_refuses_unknown_fields_and_wrong_kinds(tmp_path):
    w = DumpWriter(tmp_path / "run.dump", header())
    with pytest.raises(ValueError, match="tree_parent.*not a cycle field"):
        w.cycle("a", 0, tree_parent=[0])
    with pytest.raises(ValueError, match="bonus.*integer"):
        w.cycle("a", 0, bonus=1.5)
    with pytest.raises(ValueError, match="visibility_form='packed'"):
        w.cycle("a", 0, visibility_form="packed")
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.cycle("a", 0)
    with pytest.raises(ValueError, match="folder .* does not exist"):
        DumpWriter(tmp_path / "no" / "run.dump", header())


def test_reader_reports_unknown_fields_and_refuses_wrong_dtypes(tmp_path):
    with DumpWriter(tmp_path / "run.dump", header()) as w:
        w.cycle("a", 0, bonus=3)
    p = tmp_path / "run.dump"
    lines = p.read_text().splitlines()
    rec = json.loads(lines[1])
    rec["from_the_future"] = 1
    rec["tree_parents"] = {"dtype": "float32", "shape": [1], "as": "<f4", "z": ""}
    lines[1] = json.dumps(rec)
    p.write_text("\n".join(lines) + "\n")
    r = next(iter(read_dump(p)[1]))
    assert r.unknown == ["from_the_future"] and r["bonus"] == 3
    with pytest.raises(DumpFileError, match=r"run.dump:2: tree_parents has dtype float32, not int"):
        r["tree_parents"]


@pytest.mark.parametrize("text,match", [
    ("hello\n", "not a ddtree-workbench-dump"),
    ('{"format": "ddtree-workbench-trace", "version": 2}\n', "not a ddtree-workbench-dump"),
    ('{"format": "ddtree-workbench-dump", "version": 99, "engine": {}, "pair": {}}\n', "dump version 99"),
    ('{"format": "ddtree-workbench-dump", "version": 1, "engine": 3, "pair": {}}\n', "'engine' is not an object"),
    ('{"format": "ddtree-workbench-dump"', "no whole header line"),
])
def test_foreign_or_unknown_files_refused_in_one_line(tmp_path, text, match):
    p = tmp_path / "x.dump"
    p.write_text(text)
    with pytest.raises(DumpFileError, match=match) as e:
        read_dump(p)
    assert "\n" not in str(e.value)


def test_damaged_middle_line_and_bad_end_count(tmp_path):
    with DumpWriter(tmp_path / "run.dump", header()) as w:
        for step in range(3):
            w.cycle("a", step, bonus=step)
    p = tmp_path / "run.dump"
    lines = p.read_text().splitlines()
    p.write_text("\n".join([lines[0], lines[1], "{not json", *lines[3:]]) + "\n")
    with pytest.raises(DumpFileError, match=r"run.dump:3: not valid JSON"):
        list(read_dump(p)[1])
    p.write_text("\n".join([lines[0], lines[1], *lines[3:]]) + "\n")  # a record dropped: the end line disagrees
    with pytest.raises(DumpFileError, match="counts 3 records, the file has 2"):
        list(read_dump(p)[1])


def test_every_field_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "dump-format.md").read_text()
    from workbench.conform.dump import REQUEST_FIELDS

    for f in (*CYCLE_FIELDS, *REQUEST_FIELDS):
        assert f"`{f.name}`" in doc, f.name


def test_reopen_cuts_the_end_line_and_goes_on(tmp_path):
    w = DumpWriter(tmp_path / "run.dump", header())
    w.cycle("a", 0, bonus=1)
    w.close()
    w.reopen()
    w.cycle("a", 1, bonus=2)
    w.close()
    _, recs = read_dump(tmp_path / "run.dump")
    assert [r["bonus"] for r in recs] == [1, 2] and recs.complete and recs.end["records"] == 2
