"""Kernel backend names, which SGLang kernel each one runs where, and the errors when one cannot run.

The CUDA JIT kernel itself cannot run here (no GPU); its parity tests are in tests/gpu/.
Here the missing pieces (apache-tvm-ffi, nvcc) are simulated by monkeypatching.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util

import pytest
import torch

import ddtree_kernels.sglang_backend as sb
from ddtree_kernels import BACKENDS, accept, chain_tree, check_backend, compile_tree


@pytest.fixture
def fresh_jit(monkeypatch):
    """Forget any loaded JIT module so each test sees the load path."""
    monkeypatch.setattr(sb, "_jit", None)


def test_backend_names_and_unknown_name():
    assert BACKENDS == ("torch", "sglang", "sglang-triton")
    with pytest.raises(ValueError, match=r"kernel_backend='cuda-magic' is not one of torch, sglang, sglang-triton"):
        check_backend("cuda-magic")


@pytest.mark.parametrize("backend", ["sglang", "sglang-triton"])
def test_sglang_backends_name_the_missing_package(monkeypatch, backend):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    msg = f"kernel_backend='{backend}' needs the 'sglang' package.*make install-sglang"
    with pytest.raises(RuntimeError, match=msg):
        check_backend(backend)


def test_which_kernel_runs_where():
    assert sb.uses_jit("sglang", torch.device("cuda")) and sb.uses_jit("sglang", "cuda:1")
    assert not sb.uses_jit("sglang", "cpu")
    assert not sb.uses_jit("sglang-triton", "cuda") and not sb.uses_jit("torch", "cuda")
    assert sb.kernel_name("sglang", "cuda").startswith(sb.JIT_KERNEL)
    assert sb.kernel_name("sglang", "cpu") == f"{sb.TRITON_KERNEL} (Triton interpreter on the CPU)"
    assert sb.kernel_name("sglang-triton", "cuda") == f"{sb.TRITON_KERNEL} (Triton)"


def test_cpu_never_builds_the_jit_kernel(monkeypatch, fresh_jit):
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")

    def boom():
        raise AssertionError("the JIT kernel must not be loaded for CPU tensors")

    monkeypatch.setattr(sb, "load_jit", boom)
    check_backend("sglang", torch.device("cpu"))
    check_backend("sglang-triton", torch.device("cuda"))


def test_missing_tvm_ffi_is_named(monkeypatch, fresh_jit):
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tvm_ffi" else real(name, *a))
    with pytest.raises(RuntimeError) as e:
        check_backend("sglang", torch.device("cuda"))
    msg = str(e.value)
    assert "\n" not in msg
    assert "apache-tvm-ffi" in msg and "pip install apache-tvm-ffi==0.1.11" in msg and "sglang-triton" in msg


def _pretend_tvm_ffi(monkeypatch):
    real = importlib.util.find_spec
    fake = importlib.machinery.ModuleSpec("tvm_ffi", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: fake if name == "tvm_ffi" else real(name, *a))


def _failing_build(monkeypatch, exc):
    tree = pytest.importorskip("sglang.kernels.ops.speculative.tree")

    def build():
        raise exc

    monkeypatch.setattr(tree, "_jit_tree_module", build)


def test_missing_nvcc_is_named(monkeypatch, tmp_path, fresh_jit):
    _pretend_tvm_ffi(monkeypatch)
    _failing_build(monkeypatch, FileNotFoundError(2, "No such file or directory", "/nowhere/bin/nvcc"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))  # a CUDA root without bin/nvcc
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert sb.nvcc_path() is None
    with pytest.raises(RuntimeError) as e:
        check_backend("sglang", "cuda")
    msg = str(e.value)
    assert "\n" not in msg and "needs nvcc" in msg and "CUDA_HOME" in msg and "sglang-triton" in msg


def _fake_nvcc(monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))


def test_missing_ninja_is_named(monkeypatch, tmp_path, fresh_jit):
    _pretend_tvm_ffi(monkeypatch)
    _failing_build(monkeypatch, FileNotFoundError(2, "No such file or directory", "ninja"))
    _fake_nvcc(monkeypatch, tmp_path)
    monkeypatch.setattr(sb, "ninja_on_path", lambda: False)
    with pytest.raises(RuntimeError, match=r"needs the ninja build tool .*pip install ninja; or use "
                                           r"kernel_backend='sglang-triton'"):
        check_backend("sglang", "cuda")


def test_a_pip_installed_ninja_is_put_on_path(monkeypatch, tmp_path):
    import shutil

    exe_dir = tmp_path / "venv-bin"
    exe_dir.mkdir()
    (exe_dir / "ninja").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sb.sys, "executable", str(exe_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    assert sb.ninja_on_path()
    assert sb.os.environ["PATH"].split(sb.os.pathsep)[0] == str(exe_dir)


def test_other_build_failures_are_one_line(monkeypatch, tmp_path, fresh_jit):
    _pretend_tvm_ffi(monkeypatch)
    _failing_build(monkeypatch, RuntimeError("ninja: build stopped:\n  subcommand failed"))
    _fake_nvcc(monkeypatch, tmp_path)
    monkeypatch.setattr(sb, "ninja_on_path", lambda: True)
    assert sb.nvcc_path() == str(tmp_path / "bin" / "nvcc")
    with pytest.raises(RuntimeError, match=r"^SGLang's JIT tree kernel failed to build: ninja: build stopped: "
                                           r"subcommand failed; or use kernel_backend='sglang-triton'"):
        check_backend("sglang", "cuda")


def test_jit_path_passes_sglangs_own_arguments(monkeypatch, fresh_jit):
    """``jit=True`` calls the JIT module's verify_tree_greedy with exactly the Triton kernel's arguments
    (same signature in sglang); stand the Triton kernel in for it and check the walk is right."""
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    triton_fn = sb.load_spec_tree(torch.device("cpu")).verify_tree_greedy_triton
    calls = []

    class FakeJit:
        @staticmethod
        def verify_tree_greedy(*args):
            calls.append([(a.dtype, tuple(a.shape)) for a in args])
            triton_fn(*args)

    monkeypatch.setattr(sb, "_jit", FakeJit)
    tree = chain_tree(torch.tensor([[5, 6, 7]]), torch.tensor([4]))
    ct = compile_tree(tree, 0, 3)
    choice = torch.tensor([[5, 6, 9, 9]])
    index, num, predicts = sb.verify_tree_greedy(tree.tokens, ct.retrieve_index, ct.retrieve_next_token,
                                                 ct.retrieve_next_sibling, choice, 3, jit=True)
    assert calls == [[(torch.int32, (4,)), (torch.int32, (1, 4)), (torch.int32, (1,))] + [(torch.int64, (1, 4))] * 5]
    assert num.tolist() == [2] and index.tolist() == [[0, 1, 2, -1]] and int(predicts[2]) == 9


def test_sglang_triton_equals_torch_on_a_branching_tree():
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    from ddtree_kernels import build_tree

    g = torch.Generator().manual_seed(3)
    lp = torch.log_softmax(torch.randn(2, 4, 20, generator=g) * 3, -1)
    tree = build_tree(lp, torch.tensor([1, 2]), budget=12)
    ct = compile_tree(tree, 0, 4)
    choice = torch.where(torch.rand(2, 13, generator=g) < 0.7, tree.tokens.roll(-1, 1), 0)
    a, b = accept("torch", tree, ct, choice, 4), accept("sglang-triton", tree, ct, choice, 4)
    assert torch.equal(a.index, b.index) and torch.equal(a.length, b.length) and torch.equal(a.bonus, b.bonus)
