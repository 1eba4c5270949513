"""The engine's fast paths (reused mask and KV buffers, the reference decoder, stage timing) are exact."""
from __future__ import annotations

import json

import pytest
import torch

import workbench as wb
from ddtree_kernels import build_tree, compile_tree
from workbench.records.cycle import STAGES, percentiles
from workbench.bench.plain_decoder import compare_reference, reference_generate
from workbench.models.masks import PrefixMask as MaskBuffer


def fresh_mask(vis: torch.Tensor, start: int) -> torch.Tensor:
    """What the buffer must equal: a new [1, 1, n, start + n] additive mask."""
    n = vis.shape[-1]
    full = torch.cat([torch.ones(1, n, start, dtype=torch.bool), vis], dim=2)[:, None]
    return torch.zeros(full.shape).masked_fill(~full, float("-inf"))


def test_mask_buffer_equals_a_fresh_mask_every_cycle():
    """Starts grow and trees shrink and grow, as in a session; the buffer also has to grow."""
    g = torch.Generator().manual_seed(0)
    buf = MaskBuffer(torch.float32, torch.device("cpu"))
    start = 3
    for budget in [8, 40, 2, 64, 5, 300, 16]:
        lp = torch.log_softmax(torch.randn(1, 6, 30, generator=g), -1)
        tree = build_tree(lp, torch.tensor([0]), budget)
        vis = compile_tree(tree, start, 6).visibility
        assert torch.equal(buf.mask(vis, start), fresh_mask(vis, start)), (budget, start)
        start += int(torch.randint(1, 7, (1,), generator=g))


def test_percentiles_nearest_rank():
    assert percentiles([3, 1, 2, 10, 4, 5, 6, 7, 8, 9]) == {"p50": 5, "p90": 9, "max": 10}
    assert percentiles([]) == {"p50": 0.0, "p90": 0.0, "max": 0.0}


def test_stage_times_add_up_to_the_cycle(engine, eval_prompts):
    s = engine.session(eval_prompts[0]["prompt"], policy=wb.DDTree(16), max_new_tokens=24)
    for _ in range(3):
        c = s.step()
        assert set(c.stage_seconds) == set(STAGES), c.stage_seconds
        assert all(v >= 0 for v in c.stage_seconds.values())
    pct = s.trace.stage_percentiles()
    assert pct["cycle"]["p50"] <= pct["cycle"]["p90"] <= pct["cycle"]["max"]
    out = s.trace.outside_cycles()
    assert out["prefill"] > 0 and out["setup"] > 0 and out["first_cycle"] == s.cycles[0].seconds


@pytest.mark.parametrize("budget", [4, 16, 64])
def test_reference_decoder_makes_the_engines_trees(engine, eval_prompts, budget):
    """The speed baseline is only fair if it does the same work: same tokens, same accept lengths."""
    for item in eval_prompts[:2]:
        ours = engine.session(item["prompt"], policy=wb.DDTree(budget), max_new_tokens=40)
        ours.run()
        ref = reference_generate(engine.models, item["prompt"], budget, 40)
        assert ref.tokens == ours.tokens
        assert ref.accept_lengths == ours.trace.accept_lengths


def test_compare_reference_reports_ratios(engine, eval_prompts):
    res = compare_reference(engine, eval_prompts[:1], budgets=(8,), max_new_tokens=24, progress=False)
    r = res["DDTree(8)"]
    assert r["same_trees"] is True and r["tokens_per_s_ratio"] > 0
    assert r["engine"]["cycle"]["p50"] > 0 and r["reference"]["verify"]["p50"] > 0


def test_bench_profile_and_reference_from_the_cli(tmp_path, eval_prompts, capsys):
    from workbench.__main__ import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(eval_prompts[0]) + "\n")
    rc = main(["bench", "--policies", "ar,ddtree:8", "--prompts", str(prompts), "--max-new-tokens", "12",
               "--reference", "--profile", str(tmp_path / "prof"), "--no-progress"])
    text, err = capsys.readouterr()
    assert rc == 0, err
    assert "p50/p90/max" in text and "DDTree(8)" in text and "reference" in text
    trace = json.loads((tmp_path / "prof" / "DDTree(8).trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"draft", "tree_build", "verify", "commit"} <= names  # the stages are ranges in the trace


def test_bench_json_with_reference_is_one_object(tmp_path, eval_prompts, capsys):
    """--json prints exactly one JSON document: the summary with the reference comparison and op counts."""
    from workbench.__main__ import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(eval_prompts[0]) + "\n")
    rc = main(["bench", "--policies", "ddtree:8", "--prompts", str(prompts), "--max-new-tokens", "10",
               "--repeats", "1", "--reference", "--json", "--no-progress"])
    text, err = capsys.readouterr()
    assert rc == 0, err
    lines = text.strip().splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert obj["reference"]["DDTree(8)"]["same_trees"] is True
    assert obj["ops_per_cycle"] and "DDTree(8)" in json.dumps(obj["ops_per_cycle"])
