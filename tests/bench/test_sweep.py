"""workbench.bench.sweep (with random_models, forward_timing, shapes.memory_fit and sweep_command): the measured
verify/draft sweep runs the engine's own states on embedded and random-weight models, refuses what would not
fit before allocating, and reads back; the GPU check's sweep section runs on a tiny config on the CPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from workbench.bench import sweep as sw
from workbench.bench.forward_timing import DraftForward
from workbench.bench.random_models import cut_configs, random_models
from workbench.shapes.memory_fit import needed_bytes
from workbench.shapes.measured import sweep_error
from tiny_models import tiny_qwen3_configs

ROOT = Path(__file__).resolve().parents[2]

# A Qwen3 layout small enough to build and sweep in a second (the random-weight path, no checkpoint).
TINY, TINY_DRAFT = tiny_qwen3_configs()


def test_cut_configs_keep_widths_and_the_drafters_feature_count():
    t, d = cut_configs("qwen3-8b", "qwen3-8b-dflash-b16", layers=2, draft_layers=1)
    assert (t["num_hidden_layers"], t["hidden_size"], t["vocab_size"]) == (2, 4096, 151936)
    assert d["num_hidden_layers"] == 1 and d["num_target_layers"] == 2
    assert d["dflash_config"]["target_layer_ids"] == [1, 1, 1, 1, 1]  # five features (fc width), clamped into 2 layers
    assert "2 of 36 layers" in t["_name"]
    with pytest.raises(ValueError, match="layers=40 must be an integer from 1 to the config's 36"):
        cut_configs("qwen3-8b", None, layers=40)


def test_a_sweep_that_would_not_fit_is_refused_in_one_line_before_allocating():
    t, d = cut_configs("qwen3-8b", "qwen3-8b-dflash-b16")
    need = needed_bytes(t, d, 1, 1, 16, "bfloat16")
    assert need["weights"] > 15e9  # ~8B target + drafter layers in bf16
    with pytest.raises(ValueError) as e:
        random_models("qwen3-8b", "qwen3-8b-dflash-b16", "cpu", "float32", rows=4096, nodes=64, context=4096)
    msg = str(e.value)
    assert "\n" not in msg and "qwen3-8b" in msg and "GiB" in msg and "cut layers" in msg
    # more rows need more bytes (K/V and activations), the same weights
    more = needed_bytes(t, d, 16, 64, 512, "bfloat16")
    assert more["weights"] == needed_bytes(t, d, 1, 64, 512, "bfloat16")["weights"]
    assert more["kv"] == 16 * needed_bytes(t, d, 1, 64, 512, "bfloat16")["kv"]


def test_a_batch_the_memory_cannot_hold_is_refused_before_any_state_is_built(engine):
    with pytest.raises(ValueError) as e:
        sw.sweep(engine, nodes=(64,), rows=(2_000_000,), context=512, repeats=1, warmup=0)
    msg = str(e.value)
    assert "\n" not in msg and "rows=2000000" in msg and "GiB" in msg and "fewer rows, nodes" in msg


def test_sweep_times_every_point_and_reads_back(engine, tmp_path):
    s = sw.sweep(engine, nodes=(1, 4), rows=(1, 2), context=24, repeats=2, warmup=1, device_profile=False)
    verify, draft = s.select("verify"), s.select("draft")
    assert [(p.rows, p.nodes) for p in verify] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert [p.rows for p in draft] == [1, 2] and all(p.nodes == engine.models.block_size for p in draft)
    assert all(len(p.samples) == 2 and min(p.samples) > 0 and p.ops > 0 for p in s.points)
    assert all(p.keys == 24 + 4 for p in verify)  # static shapes: context + max(nodes) columns
    sw.save(s, tmp_path / "s.json")
    back = sw.load(tmp_path / "s.json")
    assert [p.as_dict() for p in back.points] == [p.as_dict() for p in s.points]
    err = sweep_error(back, device=(1e11, 1e10))
    assert len(err.rows) == 6 and err.max_rel_error >= err.median_rel_error >= 0


def test_each_point_keeps_its_mask_buffer_across_rounds(engine, monkeypatch):
    """A state verifies one node count: after its first verify the mask is never rebuilt (as in the engine's
    static buckets, and what a CUDA graph's fixed addresses need); alternating counts would rebuild it per call."""
    from workbench.models import PrefixMask

    fresh = []
    build = PrefixMask._fresh
    monkeypatch.setattr(PrefixMask, "_fresh", lambda self, *a: (fresh.append(a[1]), build(self, *a))[1])
    s = sw.sweep(engine, nodes=(1, 4, 16), rows=(1,), context=24, repeats=3, warmup=1, draft=False,
                 device_profile=False)
    assert sorted(fresh) == [1, 4, 16]  # one build per point, none in the 3 timed rounds
    assert all(len(p.samples) == 3 for p in s.points)


def test_random_weight_sweep_counts_more_ops_with_more_layers():
    """The verify really runs the built model: one more target layer dispatches more ops, and the drafter's
    forward gives finite logits."""
    ops = {}
    for layers in (1, 3):
        m = random_models(TINY, TINY_DRAFT, "cpu", "float32", layers=layers, rows=1, nodes=4, context=16)
        s = sw.sweep(m, nodes=(4,), rows=(1,), context=16, repeats=1, warmup=0, device_profile=False)
        ops[layers] = s.select("verify")[0].ops
    assert ops[3] > ops[1]
    d = DraftForward(m, 1, 16, 0)
    with torch.no_grad():
        logits, _ = d.call()()
    assert logits.shape == (1, 7, 256) and torch.isfinite(logits).all()


def test_the_gpu_checks_sweep_section_runs_on_a_tiny_config_on_cpu():
    from shared_checks import load_script

    check = load_script(ROOT / "tests" / "gpu" / "check_cuda.py", "check_cuda_sweep")
    out = check.cost_sweep("cpu", TINY, TINY_DRAFT, nodes=(1, 4), rows=(1, 2), context=16, repeats=1, warmup=0,
                           dtype="float32")
    assert out["ok"] and 0 <= out["median_rel_error"] <= out["max_rel_error"]
    assert len(out["ms [median, [p25, p75]]"]) == 4 + 2  # verify rows x nodes + draft per rows (eager only on CPU)
    json.dumps(out)


def test_cli_reads_a_saved_sweep_and_refuses_bad_input(engine, tmp_path, capsys):
    from workbench.cli import main

    s = sw.sweep(engine, nodes=(1, 2), rows=(1,), context=20, repeats=1, warmup=0, draft=False)
    sw.save(s, tmp_path / "s.json")
    assert main(["sweep", "--from", str(tmp_path / "s.json"), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert len(obj["model_error"]["rows"]) == 2 and obj["sweep"]["settings"]["context"] == 20
    assert main(["sweep", "--nodes", "0,4"]) == 2
    assert main(["sweep", "--pair", "hybrid", "--layers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["workbench: error: --nodes '0,4': each must be 1 or more",
                   "workbench: error: --layers / --draft-layers cut a random-weight --config; an embedded pair runs whole"]


# ------------------------------------------------------------------------- refusals, before any weight is built
def write_json(path: Path, obj) -> str:
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return str(path)


def test_a_drafter_that_does_not_fit_the_target_is_refused_before_any_weight(monkeypatch):
    """The default drafter (Qwen3-8B's, 4096 wide) beside a tiny target is refused on the configs as given,
    before 20 s of random weights are built only to fail with a torch shape error."""
    import transformers

    def built(*a, **k):
        raise AssertionError("random weights were built for a pair that cannot run")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", built)
    with pytest.raises(sw.SweepInputError) as e:
        random_models(TINY, "qwen3-8b-dflash-b16", "cpu", "float32")
    assert str(e.value) == ("draft config qwen3-8b-dflash-b16 does not fit target config tiny-qwen3: vocab size "
                            "differs: target 256 vs draft 151936; give a drafter config made for tiny-qwen3 "
                            "(draft_config=, --draft-config)")
    wide = dict(TINY_DRAFT, hidden_size=128)
    with pytest.raises(sw.SweepInputError, match=r"hidden size differs: target 64 vs draft 128; give a drafter"):
        cut_configs(TINY, wide)
    # target layers out of range of the target as given (the clamp into a cut target comes after this check)
    deep = dict(TINY_DRAFT, dflash_config={"block_size": 8, "target_layer_ids": [0, 5]})
    with pytest.raises(sw.SweepInputError, match=r"draft target_layer_ids \[0, 5\] out of range for a target "
                       r"with 3 layers \(bad: \[5\]\)"):
        cut_configs(TINY, deep, layers=2)
    with pytest.raises(sw.SweepInputError, match=r"^target config tiny-dflash is a DFlash drafter; give a target"):
        cut_configs(TINY_DRAFT, TINY_DRAFT)
    with pytest.raises(sw.SweepInputError, match=r"^draft config tiny-qwen3 is not a DFlash drafter"):
        cut_configs(TINY, TINY)
    assert cut_configs(TINY, TINY_DRAFT, layers=2)[1]["dflash_config"]["target_layer_ids"] == [0, 1]


def test_a_config_the_cost_model_cannot_read_is_one_line_naming_it(tmp_path):
    path = write_json(tmp_path / "a.json", {"a": 1})
    with pytest.raises(sw.SweepInputError) as e:
        cut_configs(path, "qwen3-8b-dflash-b16")
    msg = str(e.value)
    assert msg.startswith(f"{path}: target config model_type=None has no cost model; known: ") and "qwen3" in msg
    assert "\n" not in msg


def test_a_file_that_is_not_a_saved_sweep_is_one_line_naming_it(tmp_path):
    fix = "give a file written by sweep --save (workbench.bench.sweep.save)"
    cases = {"missing.json": (None, "does not exist"),
             "notjson.json": ("not json", "is not JSON (Expecting value at line 1 column 1)"),
             "list.json": ([1, 2], "holds a JSON list, not a saved sweep's object"),
             "nopoints.json": ({"settings": {}}, "has no 'points' (list) as a saved sweep does"),
             "nosettings.json": ({"points": [], "settings": {"model": "m"}, "target_config": {}},
                                 ": its settings lack layers, draft_layers, dtype, device, context, repeats, warmup, "
                                 "threads")}
    for name, (content, says) in cases.items():
        path = tmp_path / name
        if content is not None:
            write_json(path, content)
        with pytest.raises(sw.SweepInputError) as e:
            sw.load(path)
        sep = "" if says.startswith(":") else " "
        assert str(e.value) == f"saved sweep {path}{sep}{says}; {fix}", name
    with pytest.raises(sw.SweepInputError, match=r"is a directory"):
        sw.load(tmp_path)


def cli(argv, capsys) -> tuple[int, list[str]]:
    from workbench.cli import main

    rc = main(argv)
    return rc, capsys.readouterr().err.strip().splitlines()


SAVE_FIX = "give a file written by sweep --save (workbench.bench.sweep.save)"
CLI_REFUSALS = {  # case: (argv, the line's start); {bad} etc. are files the test writes
    "config-without-fields": (["--config", "{bad}"], "{bad}: target config model_type=None has no cost model; known: "),
    "from-without-points": (["--from", "{nopoints}"],
                            "saved sweep {nopoints} has no 'points' (list) as a saved sweep does; " + SAVE_FIX),
    "from-not-json": (["--from", "{notjson}"],
                      "saved sweep {notjson} is not JSON (Expecting value at line 1 column 1); " + SAVE_FIX),
    "config-with-the-default-drafter": (["--config", "{tiny}"],
                                        "draft config qwen3-8b-dflash-b16 does not fit target config {tiny}: vocab "
                                        "size differs: target 256 vs draft 151936; give a drafter config made for "
                                        "{tiny} (draft_config=, --draft-config)"),
    "threads-0": (["--threads", "0"], "argument --threads: threads=0 must be a positive integer"),
    "from-with-measuring-options": (["--from", "{nopoints}", "--config", "qwen3-8b", "--nodes", "1,2", "--threads", "2"],
                                    "--config, --nodes, --threads would be ignored by --from (a saved sweep): drop "
                                    "them"),
    "tp-table-with-measuring-options": (["--tp-table", "--device", "cuda", "--repeats", "3"],
                                        "--device, --repeats would be ignored by --tp-table (the cost model's table): "
                                        "drop them"),
    "tp-table-with-from": (["--tp-table", "--from", "{nopoints}"],
                           "--from would be ignored by --tp-table (the cost model's table): drop it"),
    "batch-without-tp-table": (["--batch", "8"], "--batch would be ignored by a measured sweep: drop it (--batch "
                                                 "sizes the --tp-table; a measured sweep's batches are --rows)"),
}


@pytest.mark.parametrize("case", sorted(CLI_REFUSALS))
def test_cli_refuses_what_the_sweep_cannot_use_in_one_line(case, tmp_path, capsys, monkeypatch):
    """Each is one line and exit 2, before any weight is built: never a traceback, a raw decoder message
    without the file, weights built then a shape error, or an option silently ignored."""
    import transformers

    def built(*a, **k):
        raise AssertionError("random weights were built for a pair that cannot run")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", built)
    files = {"bad": write_json(tmp_path / "a.json", {"a": 1}),
             "nopoints": write_json(tmp_path / "nopoints.json", {"settings": {}}),
             "notjson": write_json(tmp_path / "notjson.json", "not json"),
             "tiny": write_json(tmp_path / "tiny.json", {k: v for k, v in TINY.items() if k != "_name"})}
    argv, says = CLI_REFUSALS[case]
    rc, err = cli(["sweep", *(a.format(**files) for a in argv)], capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"workbench: error: {says.format(**files)}"), err


def test_options_at_their_defaults_are_not_refused_beside_the_tp_table(capsys):
    rc, _ = cli(["sweep", "--tp-table", "--batch", "8", "--device", "cpu", "--repeats", "7", "--json"], capsys)
    assert rc == 0
