"""wb.shapes: capture hooks, shape tables, contract checks (each shown failing on broken input), meta plans."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import workbench as wb
from workbench.shapes.hooks import hooks_installed
from workbench.records.forward import ForwardMode
from workbench.shapes import CONFIGS, target_record

PROMPT = "t1 t2 t3 t4 t5"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_models import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("shapes"), vocab=64, hidden=32, layers=4, heads=2, kv_heads=1,
                     layer_ids=(1, 2), block_size=8, seed=3)
    return wb.load(target=t, draft=d)


@pytest.fixture(scope="module")
def traces(tiny):
    """One run per policy, the second cycle under a capture (so traces mix captured and plain cycles)."""
    out = {}
    for pol in (wb.AR(), wb.DFlash(), wb.DDTree(16)):
        s = tiny.session(PROMPT, policy=pol, max_new_tokens=24)
        s.step()
        with wb.shapes.capture(s):
            s.step()
        s.run()
        out[str(pol)] = s.trace
    return out


def _plain(x) -> bool:
    """Only JSON-like values: shapes and dtypes, never tensors."""
    if isinstance(x, dict):
        return all(_plain(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    return isinstance(x, (int, str, float)) and not isinstance(x, torch.Tensor)


# ------------------------------------------------------------------------------------------------ capture
def test_capture_records_modules_and_restores(tiny):
    s = tiny.session(PROMPT, policy=wb.DDTree(16), max_new_tokens=24)
    assert s.capture is None
    with wb.shapes.capture(s) as cap:
        assert s.capture is cap
        c = s.step()
    assert s.capture is None
    assert hooks_installed(tiny.models.target) == 0 and hooks_installed(tiny.models.draft) == 0
    draft_rec, target_rec = c.forwards
    names = [m["name"] for m in target_rec.modules]
    n = int(c.tokens.shape[0])
    L = tiny.models.target.config.num_hidden_layers
    for i in range(L):
        for sub in ("q_proj", "k_proj", "v_proj"):
            assert f"model.layers.{i}.self_attn.{sub}" in names
        assert f"model.layers.{i}.self_attn" in names
    assert names[0] == "model.embed_tokens" and names[-1] == "lm_head" and "model.norm" in names
    by = {m["name"]: m for m in target_rec.modules}
    assert by["model.layers.0.self_attn.q_proj"]["outputs"]["output"]["shape"] == [1, n, 32]  # 2 heads x 16
    assert by["model.layers.0.self_attn.k_proj"]["outputs"]["output"]["shape"] == [1, n, 16]  # 1 kv head x 16
    assert by["model.layers.0.self_attn"]["inputs"]["attention_mask"]["shape"] == [1, 1, n, c.start + n]
    assert by["lm_head"]["inputs"]["input"]["shape"] == [1, n, 32]
    logits = target_rec.outputs["logits"]
    assert by["lm_head"]["outputs"]["output"] == {"shape": logits["shape"], "dtype": logits["dtype"]}
    assert logits["device"] == "cpu"
    # The drafter borrows the target's embedding and head; its k/v run twice (context, then block).
    dnames = [m["name"] for m in draft_rec.modules]
    assert {"target.model.embed_tokens", "fc", "layers.0.self_attn.k_proj#2", "target.lm_head"} <= set(dnames)
    assert _plain([dict(m) for m in target_rec.modules + draft_rec.modules])
    # Off again: the next cycle records nothing per module.
    assert s.step().forwards[-1].modules == ()


def test_capture_is_off_by_default_and_never_entered(tiny, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("capture.forward called with capture off")

    monkeypatch.setattr(wb.shapes.ShapeCapture, "forward", boom)
    s = tiny.session(PROMPT, policy=wb.DDTree(16), max_new_tokens=24)
    t = s.run()
    assert t.prefill.modules == () and all(r.modules == () for c in t for r in c.forwards)


def test_hooks_removed_and_capture_restored_on_error(tiny):
    cap = wb.shapes.ShapeCapture(tiny)
    with pytest.raises(RuntimeError, match="inside"):
        with cap.forward("target", ForwardMode.DECODE):
            assert hooks_installed(tiny.models.target) > 0
            raise RuntimeError("inside the forward")
    assert hooks_installed(tiny.models.target) == 0
    s = tiny.session(PROMPT, policy=wb.DFlash(), max_new_tokens=24)
    sentinel = object()
    s.capture = sentinel
    with pytest.raises(KeyError):
        with wb.shapes.capture(s):
            raise KeyError("step failed")
    assert s.capture is sentinel


def test_take_returns_records_once_and_prefill_capture(tiny):
    cap = wb.shapes.ShapeCapture(tiny)
    s = tiny.session(PROMPT, policy=wb.AR(), max_new_tokens=4, capture=cap)  # captures the prefill too
    assert s.trace.prefill.mode == ForwardMode.EXTEND and s.trace.prefill.modules
    assert cap.take() == ()
    with cap.forward("target", ForwardMode.DECODE):
        tiny.models.target(input_ids=torch.tensor([[1, 2]]))
    got = cap.take()
    assert got and got[0]["name"] == "model.embed_tokens" and got[0]["outputs"]["output"]["shape"] == [1, 2, 32]
    assert cap.take() == ()


# ------------------------------------------------------------------------------------------------ tables
def test_table_compare_and_errors(traces):
    dd = traces["DDTree(16)"]
    t = wb.shapes.table(dd, mode="TARGET_VERIFY", model="target")
    rows = {(r["module"], r["io"], r["tensor"]): r for r in t}
    c = next(c for c in dd if target_record(c).modules)  # the captured cycle
    n = int(c.tokens.shape[0])
    assert rows[("model.layers.*.self_attn.q_proj", "out", "output")]["layers"] == "0-3 (x4)"
    assert rows[("(forward)", "out", "logits")]["shape"] == [1, n, 64]
    assert rows[("(forward)", "out", "logits")]["bytes"] == n * 64 * 4
    kv = rows[("(kv cache)", "state", "keys+values after")]
    assert kv["shape"] == [4, 2, 1, c.start + n, 16]
    assert "model.layers.*.self_attn.k_proj" in str(t) and "<table>" in t._repr_html_()

    cmp = wb.shapes.compare(traces)  # AR DECODE vs DFlash / DDTree TARGET_VERIFY
    assert "AR: target DECODE" in cmp.title and "DFlash: target TARGET_VERIFY" in cmp.title
    logits = next(r for r in cmp if r["tensor"] == "logits")
    assert logits["AR"]["shape"] == [1, 1, 64] and logits["DFlash"]["shape"] == [1, 8, 64]
    assert logits["DDTree(16)"]["shape"][1] > 8  # a tree verifies more tokens than the chain
    mask = next(r for r in cmp if r["module"] == "(forward)" and r["tensor"] == "attention_mask")
    assert mask["AR"] is None and "-" in str(cmp)  # a single-token decode needs no mask

    with pytest.raises(ValueError, match=r"no TARGET_VERIFY forward ran; modes that ran: EXTEND \(target\); DECODE"):
        wb.shapes.table(traces["AR"], mode="TARGET_VERIFY")
    with pytest.raises(ValueError, match=r"AR: no target TARGET_VERIFY .*DECODE"):
        wb.shapes.compare(traces, mode="TARGET_VERIFY")
    with pytest.raises(ValueError, match="is not one of EXTEND, DECODE, TARGET_VERIFY"):
        wb.shapes.table(dd, mode="VERIFY")


# ------------------------------------------------------------------------------------------------ contracts
def test_contracts_pass_on_real_runs(traces):
    for name, t in traces.items():
        res = wb.shapes.check_contracts(t)
        assert res.passed, f"{name}:\n{res}"
        assert len(res) == 7 and "PASS" in str(res)
    dd = wb.shapes.check_contracts(traces["DDTree(16)"], per_cycle=True)
    assert len([r for r in dd if r["check"].startswith("tree mask")]) >= 1


def _broken(trace, cycle_pred, change):
    """A copy of ``trace`` whose first cycle matching ``cycle_pred`` is replaced by ``change(cycle)``."""
    cycles = list(trace.cycles)
    i = next(i for i, c in enumerate(cycles[:-1]) if cycle_pred(c))
    cycles[i] = change(cycles[i])
    return wb.Trace(meta=trace.meta, prefill=trace.prefill, cycles=cycles), cycles[i].index


def _with_target(c, **kw):
    rec = target_record(c)
    new = dataclasses.replace(rec, **kw)
    return dataclasses.replace(c, forwards=tuple(new if r is rec else r for r in c.forwards))


def _has_siblings(c):
    p = c.parents[1:]
    return p.numel() > 0 and p.unique().numel() < p.numel()


BREAKS = {
    # one logits row per request instead of one per verified token
    "logits rows": lambda c: _with_target(c, outputs={**target_record(c).outputs,
                                                      "logits": {"shape": [1, 1, 64], "dtype": "float32"}}),
    # hidden states kept for the last token only
    "hidden states": lambda c: _with_target(c, outputs={**target_record(c).outputs,
                                                        "draft_context": {"shape": [1, 1, 64], "dtype": "float32"}}),
    # positions by index, not depth: siblings would get different positions
    "positions": lambda c: dataclasses.replace(c, position_ids=c.start + torch.arange(c.tokens.shape[0])),
    # an index-causal mask instead of the ancestor pattern
    "tree mask": lambda c: dataclasses.replace(
        c, visibility=torch.tril(torch.ones(c.tokens.shape[0], c.tokens.shape[0], dtype=torch.bool))),
    # a commit that claims one more accepted token than the cache kept
    "kv after commit": lambda c: dataclasses.replace(c, accepted_nodes=torch.cat([c.accepted_nodes, c.accepted_nodes[-1:]])),
}


@pytest.mark.parametrize("check", list(BREAKS))
def test_each_contract_fails_on_broken_input(traces, check):
    good = traces["DDTree(16)"]
    broken, idx = _broken(good, _has_siblings, BREAKS[check])
    res = wb.shapes.check_contracts(broken)
    failed = [r for r in res if not r["ok"]]
    assert [r["check"] for r in failed] == [next(r["check"] for r in res if r["check"].startswith(check))]
    assert failed[0]["result"] == "FAIL" and f"first failure: cycle {idx}" in failed[0]["cycles"]
    assert failed[0]["expected"] != failed[0]["got"]


def test_tree_mask_shape_contract_fails_on_wrong_mask_shape(traces):
    good = traces["DFlash"]
    broken, _ = _broken(good, lambda c: c.tokens.shape[0] > 1, lambda c: _with_target(
        c, inputs={**target_record(c).inputs, "attention_mask": {"shape": [1, 1, 8, 8], "dtype": "bool"}}))
    res = wb.shapes.check_contracts(broken)
    assert [r["check"] for r in res.failures()] == ["tree mask = ancestors"]
    assert "[1, 1, 8, 8]" in res.failures()[0]["got"]


# ------------------------------------------------------------------------------------------------ meta plans
def test_plan_qwen3_8b_on_meta_device():
    from dflash.model import build_target_layer_ids

    dcfg = json.loads((CONFIGS / "qwen3-8b-dflash-b16.json").read_text())
    assert dcfg["dflash_config"]["target_layer_ids"] == build_target_layer_ids(36, 5)
    p = wb.shapes.plan(CONFIGS / "qwen3-8b.json", batch=8, prompt_len=512, budget=64,
                       draft_config=CONFIGS / "qwen3-8b-dflash-b16.json")
    recs = dict(p.forwards)
    dd = recs["DDTree(64) verify (65 tokens)"]
    assert dd.mode == ForwardMode.TARGET_VERIFY and dd.outputs["logits"]["shape"] == [8, 65, 151936]
    assert dd.inputs["attention_mask"]["shape"] == [8, 1, 65, 577]
    assert recs["DFlash verify (16 tokens)"].outputs["logits"]["shape"] == [8, 16, 151936]
    assert recs["AR decode"].mode == ForwardMode.DECODE and recs["prefill"].mode == ForwardMode.EXTEND
    draft = recs["draft block (1st cycle, context 512)"]
    assert draft.model == "draft" and draft.outputs["logits"]["shape"] == [8, 15, 151936]
    assert draft.inputs["target_hidden"]["shape"] == [8, 512, 5 * 4096]
    cmp = p.compare()
    row = {(r["module"], r["tensor"]): r for r in cmp}
    kv = row[("(kv cache)", "keys+values after")]["DDTree(64) verify (65 tokens)"]
    assert kv["shape"] == [36, 2, 8, 577, 1024] and kv["bytes"] == 36 * 2 * 8 * 577 * 1024 * 2  # bf16
    assert row[("model.layers.*.self_attn.k_proj", "output")]["layers"] == "0-35 (x36)"
    assert "150.7 MiB" in str(cmp)  # DDTree(64) logits: 8 x 65 x 151936 x 2 bytes
    assert "577" in repr(p)


def test_plan_names_missing_fields(tmp_path):
    cfg = json.loads((CONFIGS / "qwen3-8b.json").read_text())
    for f in ("head_dim", "num_key_value_heads"):
        bad = {k: v for k, v in cfg.items() if k != f}
        with pytest.raises(ValueError, match=f"target config lacks the field '{f}'"):
            wb.shapes.plan(bad)
    d = json.loads((CONFIGS / "qwen3-8b-dflash-b16.json").read_text())
    d.pop("block_size"), d["dflash_config"].pop("block_size")
    with pytest.raises(ValueError, match="draft config lacks the field 'block_size'"):
        wb.shapes.plan(cfg, draft_config=d)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        wb.shapes.plan(cfg, prompt_len=40950, budget=64)
    with pytest.raises(ValueError, match="is not a file"):
        wb.shapes.plan(tmp_path / "nope.json")


def test_plan_matches_a_real_run(tiny):
    """The meta plan of the tiny target agrees with the shapes a real capture records."""
    cfg = json.loads((Path(tiny.models.target_dir) / "config.json").read_text())
    dcfg = json.loads((Path(tiny.models.draft_dir) / "config.json").read_text())
    p = wb.shapes.plan(cfg, batch=1, prompt_len=5, budget=7, draft_config=dcfg, dtype="float32")
    s = tiny.session(PROMPT, policy=wb.DFlash(), max_new_tokens=24, capture=wb.shapes.ShapeCapture(tiny))
    c = s.step()
    real = {(m["name"], k): v for m in target_record(c).modules for k, v in m["outputs"].items()}
    planned = {(m["name"], k): v for m in dict(p.forwards)["DFlash verify (8 tokens)"].modules
               for k, v in m["outputs"].items()}
    assert real == planned


# ------------------------------------------------------------------------------------------------ sglang names
def test_forward_mode_names_are_sglang_members():
    pytest.importorskip("sglang", reason="sglang is installed by the README set-up")
    # Importing sglang's forward_batch_info fails on a --no-deps install (torchvision), so its
    # ForwardMode class body is read from the installed source with ast unless already imported.
    names, how = wb.shapes.sglang_forward_modes()
    assert "DRAFT_EXTEND_V2" in names, how  # sanity: we read the real enum
    assert {m.value for m in ForwardMode} <= set(names)
    assert {m.name for m in ForwardMode} <= set(names)


# ------------------------------------------------------------------------------------------------ embedded default
@pytest.fixture
def embedded(request):
    from workbench.engine.loading import ASSETS

    if not (ASSETS / "training_report.json").exists():
        pytest.skip("the embedded default is still being trained (no workbench/assets/training_report.json)")
    return request.getfixturevalue("engine")


def test_embedded_default_tables_and_contracts(embedded):
    engine = embedded
    s = engine.session("def parse(line):", policy=wb.DDTree(32), max_new_tokens=24)
    with wb.shapes.capture(s):
        c = s.step()
    s.run()
    t = wb.shapes.table(s, mode="TARGET_VERIFY", model="target")
    q = next(r for r in t if r["module"] == "model.layers.*.self_attn.q_proj" and r["io"] == "out")
    cfg = engine.models.target.config
    assert q["layers"] == f"0-{cfg.num_hidden_layers - 1} (x{cfg.num_hidden_layers})"
    assert q["shape"] == [1, int(c.tokens.shape[0]), cfg.num_attention_heads * cfg.head_dim]
    res = wb.shapes.check_contracts(s)  # a session: its last cycle is checked against the live cache
    assert res.passed, str(res)
    kv = next(r for r in res if r["check"].startswith("kv"))
    assert kv["cycles"] == f"{len(s.cycles)}/{len(s.cycles)} pass"
