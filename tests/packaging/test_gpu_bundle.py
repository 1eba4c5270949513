"""tools/gpu_bundle.py: the pins match sglang's, and the sglang subset it copies works on its own.

The wheel download needs PyPI, so it is not run here (tests never download); the subset is built
from the installed sglang and run in a fresh interpreter that can see only the subset.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_bundle", ROOT / "tools" / "gpu_bundle.py")
gb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gb)


def test_gpu_extra_pins_what_sglang_pins():
    import ddtree_kernels.sglang_backend as sb

    assert sb.TVM_FFI_PIN in gb.gpu_extra() and "ninja" in gb.gpu_extra()
    try:
        sglang_reqs = importlib.metadata.requires("sglang") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("sglang kernels are installed by the README set-up")
    assert sb.TVM_FFI_PIN in sglang_reqs and "ninja" in sglang_reqs


@pytest.mark.slow
def test_sglang_subset_is_small_complete_and_self_sufficient(tmp_path):
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    site, files = gb.sglang_files()
    names = {str(f) for f in files}
    for must in ("sglang/__init__.py", "sglang/kernels/ops/speculative/spec_tree.py",
                 "sglang/kernels/ops/speculative/tree.py", "sglang/kernels/jit/csrc/speculative/tree.cuh",
                 "sglang/kernels/jit/include/sgl_kernel/speculative/eagle.cuh",
                 "sglang/kernels/jit/utils/compile/loader.py"):
        assert must in names, must
    assert not any("__pycache__" in n for n in names)
    gb.copy_subset(site, files, tmp_path)
    size = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert size < 4 * 2**20  # about 1.4 MB of sglang's 222 MB
    r = subprocess.run([sys.executable, "-c", gb._CHECK, str(tmp_path)], capture_output=True, text=True,
                       cwd=tempfile.gettempdir(), timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_out_must_be_new_or_empty(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(SystemExit, match="exists and is not empty"):
        gb.main(["--out", str(tmp_path)])
    assert (tmp_path / "x").read_text() == "keep me"


def test_bundle_takes_pyprojects_extras_less_what_the_host_has():
    assert set(gb.NOTEBOOK) | {"jupyterlab"} == set(gb.extra("notebook")) and "plotly" in gb.NOTEBOOK
    assert "triton" in gb.extra("sglang-kernels") and "triton" not in gb.sglang_kernel_extra()
    assert set(gb.sglang_kernel_extra()) == set(gb.extra("sglang-kernels")) - gb.HOST_HAS
    assert gb.NO_DEPS == ["dflash==0.1.0"]  # as the Makefile and the README install it
    # The engine's own dependencies the host lacks travel too (accelerate: weights straight onto the GPU).
    assert gb.core_missing() == ["accelerate"]
