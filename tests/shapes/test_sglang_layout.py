"""wb.shapes.sglang_layout: SGLang's tensors per forward mode.

Two kinds of test: our rules agree with SGLang's own code (imported, or one function executed
from the installed source) on random ragged batches; and contract tests that read the installed
SGLang source and fail when the expression a rule mirrors changes (each names file + expression).
"""
from __future__ import annotations

import ast
import json
import random

import pytest
import torch

import workbench as wb
from workbench.records.forward import ForwardMode, ForwardRecord
from workbench.shapes import CONFIGS
from workbench.shapes import sglang_layout as L

sglang = pytest.importorskip("sglang", reason="sglang is installed by `make install-sglang` (README set-up)")


def _random_batches(seed=0, count=12):
    rng = random.Random(seed)
    for _ in range(count):
        bs = rng.randint(1, 6)
        yield [rng.randint(0, 300) for _ in range(bs)], [rng.randint(1, 40) for _ in range(bs)]


# ------------------------------------------------------------------------------------------------ contracts
@pytest.mark.parametrize("name", list(L.SGLANG_RULES))
def test_rule_expression_is_in_installed_sglang(name):
    """Fails when sglang's source lacks the expression this rule mirrors (file, where, expression)."""
    rule = L.SGLANG_RULES[name]
    assert L.rule_holds(rule), f"sglang {rule.file} {rule.where} lacks: {rule.expression}"


def test_rule_check_fails_on_changed_source():
    """The contract check itself can fail: the same rule against an edited copy of the source."""
    rule = L.SGLANG_RULES["verify mask numel"]
    src = L.sglang_file(rule.file).read_text()
    assert "(self.draft_token_num**2) * bs" in src
    changed = ast.parse(src.replace("(self.draft_token_num**2) * bs", "self.draft_token_num * bs"))
    assert L.rule_holds(rule, ast.parse(src)) and not L.rule_holds(rule, changed)
    gone = ast.parse(src.replace("def generate_attn_arg_prefill", "def generate_attn_args"))
    assert not L.rule_holds(rule, gone)


# ------------------------------------------------------------------------------------------------ ours == sglang's code
def test_positions_match_compute_position_torch():
    # forward_batch_info.py compute_position_torch, executed from source
    for p, t in _random_batches(1):
        pos, start = L.sglang_positions(p, t)
        assert pos == L.flat_positions(p, t)
        assert start == L.indptr(t)[:-1]


@pytest.mark.parametrize("mode", ["EXTEND", "DECODE", "TARGET_VERIFY"])
def test_logits_rows_match_logits_processor(mode):
    # logits_processor.py LogitsProcessor._get_pruned_states, executed from source on row ids
    rng = random.Random(2)
    for _, t in _random_batches(2):
        if mode == "DECODE":
            t = [1] * len(t)
        assert L.sglang_logits_rows(mode, t) == L.logits_rows(mode, t)
        starts = [rng.randint(0, n) for n in t]
        assert L.sglang_logits_rows(mode, t, True, starts) == L.logits_rows(mode, t, True, starts)
    assert L.logits_rows("EXTEND", [4, 5, 6]) == [3, 8, 14]  # the last row of each request
    assert L.logits_rows("TARGET_VERIFY", [3, 2]) == [0, 1, 2, 3, 4]  # every row


def test_verify_args_match_dflash_info_uniform_and_ragged():
    # dflash_info.py DFlashVerifyInput.generate_attn_arg_prefill (executed from source); ragged batches
    # go through a real RaggedVerifyLayout (ragged_verify.py, imported)
    for p, t in _random_batches(3):
        for lens in (t, [t[0]] * len(t)):
            v = L.sglang_verify_args(p, lens, with_mask=len(set(lens)) == 1)
            assert v["qo_indptr"].dtype == torch.int32 and v["kv_indptr"].dtype == torch.int32
            assert v["qo_indptr"].tolist() == L.indptr(lens)
            assert v["kv_indptr"].tolist() == L.indptr([a + n for a, n in zip(p, lens)])
            assert v["kv_indices"].numel() == sum(p) + sum(lens)
            if len(set(lens)) == 1:
                assert v["custom_mask"].numel() == L.custom_mask_elements(p, lens, "FULL_MASK").numel
            else:
                assert v["layout"].verify_lens_cpu == lens


@pytest.mark.parametrize("mode", L.MASK_MODES)
def test_mask_sizes_match_build_tree_kernel_efficient(mode):
    # eagle_utils.py build_tree_kernel_efficient's allocation (executed from source, tree kernel not run)
    rng = random.Random(4)
    for n in (2, 8, 9, 16, 17, 32, 33, 65):
        p = [rng.randint(0, 200) for _ in range(rng.randint(1, 5))]
        try:
            ours = L.custom_mask_elements(p, [n] * len(p), mode)
        except ValueError:
            with pytest.raises(IndexError):  # sglang fails too: no packed word wider than uint32
                L.sglang_tree_mask(p, n, mode)
            assert mode == "QLEN_ONLY_BITPACKING" and n > 32
            continue
        m = L.sglang_tree_mask(p, n, mode)
        assert (int(m.numel()), str(m.dtype).replace("torch.", "")) == (ours.numel, ours.dtype)
        assert ours.bytes == m.numel() * m.element_size()


def test_ragged_mask_is_the_sum_of_per_request_masks():
    p, t = [10, 500, 0], [3, 65, 17]
    full = L.custom_mask_elements(p, t, "FULL_MASK").numel
    assert full == sum(L.custom_mask_elements([a], [n], "FULL_MASK").numel for a, n in zip(p, t))
    assert full == 3 * 13 + 65 * 565 + 17 * 17
    assert L.custom_mask_elements(p, t, "QLEN_ONLY").numel == 9 + 65 * 65 + 17 * 17
    with pytest.raises(ValueError, match="at most 32 tokens per request"):
        L.custom_mask_elements(p, t, "QLEN_ONLY_BITPACKING")
    with pytest.raises(ValueError, match="mask_mode='TREE' is not one of FULL_MASK"):
        L.custom_mask_elements(p, t, "TREE")
    with pytest.raises(ValueError, match="prefix_lens has 2 requests but token_lens has 3"):
        L.custom_mask_elements([1, 2], t)


def test_ragged_layout_and_token_grid():
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    grid = L.ragged_token_grid([1, 2, 4, 8], 65)
    assert grid == [65, 130, 260, 520]
    lay = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=[3, 65, 10], device=torch.device("cpu"), grid=grid)
    assert lay.qo_indptr_device.tolist() == L.indptr([3, 65, 10]) and lay.graph_num_tokens == 130
    tbl = L.layout("TARGET_VERIFY", [100, 200, 5], [3, 65, 10], tree=True, vocab_size=64, hidden_size=8, aux_layers=2)
    assert tbl.row("qo_indptr")["by"] == "sglang source" and "ragged" in tbl.row("qo_indptr")["note"]
    assert tbl.row("custom_mask (FULL_MASK)")["shape"] == [3 * 103 + 65 * 265 + 10 * 15]
    assert tbl.row("next_token_logits")["shape"] == [78, 64]
    assert tbl.row("hidden_states (aux, FULL)")["shape"] == [78, 16]


def test_hidden_states_from_pack_aux_hidden_states():
    assert L.sglang_hidden_states(128, 4096, 5) == [128, 5 * 4096]


def test_layout_without_sglang_code_gives_the_same_numbers():
    for mode, t in (("EXTEND", [5, 9]), ("DECODE", [1, 1]), ("TARGET_VERIFY", [16, 16])):
        a = L.layout(mode, [7, 3], t, tree=True, vocab_size=10, hidden_size=4, aux_layers=3)
        b = L.layout(mode, [7, 3], t, tree=True, vocab_size=10, hidden_size=4, aux_layers=3, use_sglang=False)
        assert [(r["tensor"], r["shape"]) for r in a] == [(r["tensor"], r["shape"]) for r in b]
        assert {r["by"] for r in b} == {"workbench rule"} and "sglang source" in {r["by"] for r in a}


def test_sglang_forward_modes_read_from_source():
    names, how = L.sglang_forward_modes()
    assert how == "source (ast)" and "DRAFT_EXTEND_V2" in names
    assert {m.value for m in ForwardMode} <= set(names)


# ------------------------------------------------------------------------------------------------ views
def test_plan_logits_follow_sglang_and_include_the_drafter():
    p = wb.shapes.plan(CONFIGS / "qwen3-8b.json", batch=8, prompt_len=512, budget=64,
                       draft_config=CONFIGS / "qwen3-8b-dflash-b16.json")
    recs = dict(p.forwards)
    assert recs["prefill"].outputs["logits"]["shape"] == [8, 1, 151936]  # last row per request
    assert recs["prefill"].outputs["logits"]["device"] == "meta"
    cmp = p.compare()
    assert "draft block (1st cycle, context 512)" in cmp.labels
    sg = {(r["module"], r["tensor"]): r for r in cmp if r["module"] == "(sglang layout)"}
    assert sg[("(sglang layout)", "next_token_logits")]["prefill"]["shape"] == [8, 151936]
    assert sg[("(sglang layout)", "next_token_logits")]["DDTree(64) verify (65 tokens)"]["shape"] == [520, 151936]
    assert sg[("(sglang layout)", "custom_mask (FULL_MASK)")]["DDTree(64) verify (65 tokens)"]["shape"] == [300040]
    lay = p.sglang()
    draft = [r for r in lay if r["forward"].startswith("draft block")]
    assert {r["tensor"]: r["shape"] for r in draft}["draft logits rows"] == [8 * 15, 151936]
    assert {r["tensor"]: r["shape"] for r in draft}["kv_indptr"][0] == 9
    assert "sglang flat: 4096 tokens, logits rows 8" in repr(p) and "ours [bs, n]" in repr(p)
    full = wb.shapes.plan(CONFIGS / "qwen3-8b.json", batch=2, prompt_len=64, budget=4, prompt_logprobs=True)
    assert dict(full.forwards)["prefill"].outputs["logits"]["shape"] == [2, 64, 151936]
    assert full.sglang(mode="EXTEND").row("next_token_logits")["shape"] == [2 * 64, 151936]  # every prompt row


def test_table_sglang_view_on_a_real_run(tmp_path):
    from tiny_models import make_pair

    t, d = make_pair(tmp_path, vocab=64, hidden=32, layers=4, heads=2, kv_heads=1, layer_ids=(1, 2), block_size=8, seed=3)
    eng = wb.load(target=t, draft=d)
    s = eng.session("t1 t2 t3 t4 t5", policy=wb.DDTree(8), max_new_tokens=8)
    c = s.step()
    n = int(c.tokens.shape[0])
    tbl = wb.shapes.table(s, mode="TARGET_VERIFY", model="target", view="sglang")
    assert tbl.row("input_ids")["shape"] == [n] and tbl.row("input_ids")["ours"] == f"[1, {n}] int64"
    assert tbl.row("custom_mask (FULL_MASK)")["shape"] == [n * (c.start + n)]
    assert tbl.row("next_token_logits")["shape"] == [n, 64]
    assert tbl.row("hidden_states (aux, FULL)")["shape"] == [n, 2 * 32]
    with pytest.raises(ValueError, match="view='flat' must be 'ours' or 'sglang'"):
        wb.shapes.table(s, view="flat")
    res = wb.shapes.check_contracts(s)
    dev = next(r for r in res if r["check"] == "verify inputs on the target's device")
    assert dev["ok"] and "on cpu" in dev["got"]


# ------------------------------------------------------------------------------------------------ devices
def _rec(**devices):
    t = lambda shape, dtype, dev: {"shape": shape, "dtype": dtype, "device": dev}  # noqa: E731
    return ForwardRecord("target", ForwardMode.TARGET_VERIFY,
                         {"input_ids": t([1, 3], "int64", devices.get("ids", "cuda:0")),
                          "positions": t([1, 3], "int64", devices.get("pos", "cuda:0"))},
                         {"logits": t([1, 3, 8], "float32", devices.get("logits", "cuda:0"))}, 5, 8)


def test_record_devices_roundtrip_and_old_dicts_load():
    r = _rec(pos="cpu")
    back = ForwardRecord.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r and back.devices() == {"input_ids": "cuda:0", "positions": "cpu", "logits": "cuda:0"}
    old = r.to_dict()
    for group in ("inputs", "outputs"):
        for v in old[group].values():
            v.pop("device")
    assert set(ForwardRecord.from_dict(old).devices().values()) == {"unknown"}


def test_device_contract_fails_when_an_input_is_elsewhere(tmp_path):
    import dataclasses

    from tiny_models import make_pair

    t, d = make_pair(tmp_path, vocab=64, hidden=32, layers=2, heads=2, kv_heads=1, layer_ids=(0, 1), block_size=4, seed=5)
    s = wb.load(target=t, draft=d).session("t1 t2 t3", policy=wb.DDTree(4), max_new_tokens=12)
    s.run()
    tr = s.trace
    c = tr.cycles[0]
    rec = next(r for r in c.forwards if r.model == "target")
    moved = dataclasses.replace(rec, inputs={**rec.inputs, "positions": {**rec.inputs["positions"], "device": "cuda:0"}})
    bad = dataclasses.replace(c, forwards=tuple(moved if r is rec else r for r in c.forwards))
    res = wb.shapes.check_contracts(wb.Trace(meta=tr.meta, prefill=tr.prefill, cycles=[bad] + list(tr.cycles[1:])))
    assert [r["check"] for r in res.failures()] == ["verify inputs on the target's device"]
    assert "target.positions on cuda:0" in res.failures()[0]["got"]
    wrong = dataclasses.replace(c, retrieve_next_token=c.retrieve_next_token.to(torch.int32))
    res = wb.shapes.check_contracts(wb.Trace(meta=tr.meta, prefill=tr.prefill, cycles=[wrong] + list(tr.cycles[1:])))
    assert [r["check"] for r in res.failures()] == ["index dtypes as SGLang's"]
    assert "retrieve_next_token int32 (want int64)" in res.failures()[0]["got"]
    old = [dataclasses.replace(x, forwards=tuple(ForwardRecord.from_dict(
        {**f.to_dict(), "inputs": {k: {"shape": v["shape"], "dtype": v["dtype"]} for k, v in f.inputs.items()}})
        for f in x.forwards)) for x in tr.cycles]
    res = wb.shapes.check_contracts(wb.Trace(meta=tr.meta, prefill=tr.prefill, cycles=old))
    row = next(r for r in res if r["check"] == "verify inputs on the target's device")
    assert row["result"] == "n/a" and res.passed


def test_python_m_workbench_shapes_prints_both_layouts(tmp_path, capsys):
    from tiny_models import make_pair

    from workbench.shapes.__main__ import _main

    t, d = make_pair(tmp_path, vocab=64, hidden=32, layers=2, heads=2, kv_heads=1, layer_ids=(0, 1), block_size=4, seed=7,
                     max_positions=1024)
    assert _main(["--plan", str(t / "config.json"), "--draft-config", str(d / "config.json"), "--budget", "4"]) == 0
    out = capsys.readouterr().out
    assert "ours [bs, n]: logits [8, 1, 64]; sglang flat: 4096 tokens, logits rows 8" in out
    assert "draft block (1st cycle, context 512)" in out and "(sglang layout)" in out
