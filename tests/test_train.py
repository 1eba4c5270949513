"""The training script runs end to end in seconds (smoke recipe) and writes loadable models."""
from __future__ import annotations

import json
import subprocess
import sys

import workbench as wb


def test_train_help():
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--smoke" in r.stdout


def test_smoke_training_writes_a_pair_the_engine_loads(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--out", str(tmp_path), "--smoke"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"held_out_loss_nats", "dflash_tau", "distinct_token_share"} <= set(metrics)
    report = json.loads((tmp_path / "training_report.json").read_text())
    assert report["recipe"]["block_size"] == 8
    prompts = [json.loads(x) for x in (tmp_path / "eval_prompts.jsonl").read_text().splitlines()]
    assert prompts and all(p["prompt"] for p in prompts)
    engine = wb.load(target=tmp_path / "target", draft=tmp_path / "draft")
    s = engine.session(prompts[0]["prompt"], policy=wb.DDTree(4), max_new_tokens=8)
    ar = engine.session(prompts[0]["prompt"], policy=wb.AR(), max_new_tokens=8)
    assert s.run() and ar.run() and s.tokens == ar.tokens


def test_shipped_eval_prompts_are_held_out(eval_prompts):
    from workbench.corpus import is_held_out

    assert len(eval_prompts) >= 32
    assert all(is_held_out(p["source"]) for p in eval_prompts)
