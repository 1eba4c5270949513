"""GPU parity tests: SGLang's CUDA JIT tree kernel, its Triton kernel and the torch walk agree; the engine
on CUDA equals the engine on the CPU in float32. They skip (never pass) without CUDA: CI has no GPU.

    python -m pytest tests/gpu -p no:nbval -q      # on the GPU host
"""
from __future__ import annotations

import pytest
import torch

from check_cuda import random_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU host)")


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


def test_sync_free_tree_build():
    from check_cuda import sync_free_build

    res = sync_free_build()
    assert res["ok"], res
