"""GPU parity tests: SGLang's CUDA JIT tree kernel, its Triton kernel and the torch walk agree; the engine
on CUDA equals the engine on the CPU in float32. They skip (never pass) without CUDA: CI has no GPU. The GPU
check's own script (check_cuda.py) is exercised without one: it imports, parses its arguments, skips without
CUDA, and its payoff_calibrated section runs on the CPU on a tiny random layout.

    python -m pytest tests/gpu -p no:nbval -q      # on the GPU host
"""
from __future__ import annotations

import json

import pytest
import torch

from check_cuda import random_batch
from tiny_models import tiny_qwen3_configs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU host)")


@needs_cuda
def test_three_accept_backends_agree_with_the_python_walk():
    """40 random batches, bs 1-4, budgets 8-128: every backend's path and bonus equal the Python walk."""
    pytest.importorskip("tvm_ffi", reason="SGLang's JIT kernel needs apache-tvm-ffi")
    from ddtree_kernels import accept
    from ddtree_kernels.oracles import accept_walk_python

    lengths = set()
    for seed in range(40):
        bs, budget = 1 + seed % 4, (8, 16, 32, 64, 128)[seed % 5]
        tree, ct, choice, depth = random_batch(seed, bs, budget, "cuda")
        got = {b: accept(b, tree, ct, choice, depth) for b in ("torch", "sglang", "sglang-triton")}
        for b in range(bs):
            path, bonus = accept_walk_python(tree.tokens[b].tolist(), tree.parents[b].tolist(), choice[b].tolist())
            lengths.add(len(path) - 1)
            for name, r in got.items():
                assert r.index[b, : len(path)].tolist() == path, (name, seed)
                assert int(r.length[b]) == len(path) - 1 and int(r.bonus[b]) == bonus, (name, seed)
    assert len(lengths) >= 3  # the batches exercise short and long accepted paths


@needs_cuda
def test_sglang_backend_runs_the_jit_kernel_on_cuda():
    pytest.importorskip("tvm_ffi", reason="SGLang's JIT kernel needs apache-tvm-ffi")
    import ddtree_kernels.sglang_backend as sb
    import workbench as wb

    e = wb.load(device="cuda", dtype="float32", kernel_backend="sglang")
    assert sb._jit is not None  # built when the engine was made, not mid-run
    ref = wb.load(device="cuda", dtype="float32")
    for p in ("def parse(line):", "import os\n"):
        a = e.session(p, policy=wb.DDTree(32), max_new_tokens=48)
        a.run()
        b = ref.session(p, policy=wb.DDTree(32), max_new_tokens=48)
        b.run()
        assert a.tokens == b.tokens and [c.accepted for c in a.cycles] == [c.accepted for c in b.cycles]


@needs_cuda
def test_float32_cuda_equals_cpu():
    import workbench as wb
    from workbench.shipped import eval_prompts

    cpu, gpu = wb.load(), wb.load(device="cuda", dtype="float32")
    for item in eval_prompts()[:4]:
        a = cpu.session(item["prompt"], policy=wb.AR(), max_new_tokens=48)
        a.run()
        b = gpu.session(item["prompt"], policy=wb.DDTree(32), max_new_tokens=48)
        b.run()
        assert a.tokens == b.tokens, wb.first_divergence(b, a)


@needs_cuda
def test_sync_free_tree_build():
    from check_cuda import sync_free_build

    res = sync_free_build()
    assert res["ok"], res


# ------------------------------------------------------------------ the check's own script, without a GPU
def test_the_check_parses_its_sections_and_refuses_an_unknown_one(capsys):
    import check_cuda as cc

    assert cc.parse_args([]).sections == cc.SECTIONS and cc.SECTIONS[-1] == "payoff_calibrated"
    args = cc.parse_args(["--sections", "payoff_calibrated,accept_backends", "--prompts", "10"])
    assert args.sections == ("accept_backends", "payoff_calibrated") and args.prompts == 10  # the check's own order
    with pytest.raises(SystemExit) as e:
        cc.parse_args(["--sections", "payoff,stages"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("error: argument --sections: 'payoff,stages': unknown section payoff; give some of "
                        f"{','.join(cc.SECTIONS)}"), err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip is what is tested; a GPU host runs the check")
def test_without_cuda_the_check_says_why_and_exits_0(capsys):
    import check_cuda as cc

    assert cc.main(["--sections", "payoff_calibrated"]) == 0
    assert capsys.readouterr().out.startswith("skipped: no CUDA device on this machine")


# A Qwen3 layout small enough for the CPU (the random-weight path, no checkpoint), its vocabulary the embedded
# tokenizer's 4096 ids
TINY, TINY_DRAFT = tiny_qwen3_configs(vocab=4096, target_layer_ids=(0, 1))


@pytest.mark.slow  # 143 tiny decodes and the branching pass (10): a minute or two on a shared 2-core machine
def test_the_payoff_section_runs_on_a_tiny_random_layout_on_the_cpu(tmp_path):
    """payoff_calibrated's CPU path: the stand-in calibration and learned head bind to the random pair, pays-off
    measures the seven calibrated policies against the best DDTree budget at batch 8, static and refilled (eager:
    CUDA graphs need a GPU; batch 1 runs the same section code, and pays-off's own tests cover it)."""
    import check_cuda as cc
    from workbench.engine.policies import CondTree, PathTree
    from workbench.models.identity import pair_identity

    printed = []
    r = cc.payoff_calibrated("cpu", TINY, TINY_DRAFT, prompts=10, max_new_tokens=4, batches=(8,), dtype="float32",
                             say=printed.append)
    assert r["ok"] and set(r) >= {"eager", "calibration"} and "graphs" not in r, r
    mine = ("PathTree(16)", "CostTree(64)", "CutTree(16)", "PairTree(16)", "PairChain(8)", "CondTree(16)",
            "CondChain(8)")
    for b in ("8", "8 refilled"):
        got = r["eager"][b]
        assert {*mine, "DDTree(8)", "AR", "DFlash"} <= set(got["tok/fwd"]) and len(got["versus_best"]) == 7
        assert all(line.startswith(tuple(f"{x} " for x in mine)) for line in got["versus_best"]), got["versus_best"]
    assert "calibrated policies against the best DDTree budget" in printed[0]
    assert "calibration=" not in printed[0] and "head=" not in printed[0]
    json.dumps(r)
    # the stand-in refuses another pair as any calibration does
    from workbench.bench.random_models import random_models

    other = random_models(dict(TINY, num_hidden_layers=2), dict(TINY_DRAFT, num_target_layers=2), "cpu", "float32",
                          rows=1, nodes=8, context=16)
    mine = random_models(TINY, TINY_DRAFT, "cpu", "float32", rows=1, nodes=8, context=16)
    cal = cc.stand_in_calibration(mine, tmp_path)
    assert PathTree(16, calibration=str(cal)).for_pair(pair_identity(mine)) == PathTree(16, calibration=str(cal))
    with pytest.raises(ValueError, match="was made on another pair"):
        PathTree(16, calibration=str(cal)).for_pair(pair_identity(other))
    head = str(cc.stand_in_cond_head(mine, tmp_path))  # and the stand-in head as any head does
    assert CondTree(16, head=head).for_pair(pair_identity(mine)) == CondTree(16, head=head)
    with pytest.raises(ValueError, match="was trained on another pair"):
        CondTree(16, head=head).for_pair(pair_identity(other))
