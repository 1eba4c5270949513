"""Assemble, on a machine with PyPI, what an offline GPU host lacks to run the workbench; under 64 MiB.

    .venv/bin/python tools/gpu_bundle.py --out gpu-bundle      # then copy gpu-bundle/ to the host

The host (as described in docs/gpu.md) has Python 3.12, torch 2.11 (CUDA 13),
triton 3.6, transformers 5.17, tokenizers 0.23.2, safetensors, numpy, scipy and nvcc. The bundle holds:

  wheels/         Python 3.12 manylinux wheels: dflash==0.1.0 (installed --no-deps: dflash.model
                  needs only torch and transformers), the [gpu] extra (apache-tvm-ffi==0.1.11 and
                  ninja: they build SGLang's CUDA JIT kernel with the host's nvcc), the notebook
                  stack (plotly, ipywidgets, anywidget), the light imports of SGLang's spec_tree
                  module (the [sglang-kernels] extra), setuptools (for `pip install -e .` offline)
                  and everything those need, minus what the host has.
  sglang-subset/  the sglang modules that `sglang.kernels.ops.speculative.spec_tree` and `.tree`
                  import (read from sys.modules after importing them here; about 1 MB of the 222 MB
                  package) plus sglang/kernels/jit/{utils,include,csrc/speculative} for the CUDA kernel.
  install.sh      the offline install (pip --no-index --find-links wheels; a .pth file for the subset).
  MANIFEST.json   every file with its size, the sglang modules, and the pins.

Transformers stays the host's 5.17 (with its tokenizers 0.23.2): the workbench and dflash 0.1.0 run on
it (checked on the CPU: DDTree == AR token for token); transformers 5.15, pinned for the CPU venv,
needs tokenizers 0.22.x, which would mean replacing the host's tokenizers.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 * 2**20
PYTHON = "3.12"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
NO_DEPS = ["dflash==0.1.0"]  # its declared deps (datasets, exact tqdm/requests pins) are not imported by dflash.model
def extra(name: str) -> list[str]:
    """One optional-dependencies list of pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]


def gpu_extra() -> list[str]:
    """The [gpu] extra of pyproject.toml: apache-tvm-ffi (pinned as sglang 0.5.23 pins it) and ninja."""
    return extra("gpu")


# The [notebook] extra without JupyterLab (the host runs its own Jupyter, or the notebooks' views in it).
NOTEBOOK = [r for r in extra("notebook") if r != "jupyterlab"]
BUILD = ["setuptools>=68"]
# Already on the host (or never wanted there): dropped if some dependency pulls them in.
# The device image has scipy too (wb.analysis.paired, the pays-off verdict): a 35 MB wheel that need not travel.
HOST_HAS = {"torch", "triton", "transformers", "tokenizers", "safetensors", "numpy", "scipy", "sglang"}
SGLANG_JIT_DIRS = ("kernels/jit/utils", "kernels/jit/include", "kernels/jit/csrc/speculative")
SGLANG_MODULES = ("sglang.kernels.ops.speculative.spec_tree", "sglang.kernels.ops.speculative.tree")

# Run in a fresh interpreter: which sglang modules (files) do the kernel modules import? The JIT build is
# tried too (it fails here without tvm_ffi / nvcc, after importing what it imports lazily).
_PROBE = r"""
import importlib, json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
for m in sys.argv[1:]:
    importlib.import_module(m)
try:
    sys.modules["sglang.kernels.ops.speculative.tree"]._jit_tree_module()
except Exception:
    pass
files = sorted({m.__file__ for n, m in list(sys.modules.items())
                if n.split(".")[0] == "sglang" and getattr(m, "__file__", None)})
print(json.dumps(files))
"""

# Run with only the subset on the path for sglang: the Triton kernel must import and walk a tree.
_CHECK = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
import torch
from sglang.kernels.ops.speculative import spec_tree, tree
pred = torch.zeros(4, dtype=torch.int32); idx = torch.full((1, 4), -1, dtype=torch.int32)
num = torch.zeros(1, dtype=torch.int32)
cand = torch.tensor([[4, 5, 6, 7]]); ri = torch.arange(4)[None]
nt = torch.tensor([[1, 2, 3, -1]]); ns = torch.full((1, 4), -1); tp = torch.tensor([[5, 6, 9, 9]])
spec_tree.verify_tree_greedy_triton(pred, idx, num, cand, ri, nt, ns, tp)
assert num.tolist() == [2] and idx.tolist() == [[0, 1, 2, -1]], (num, idx)
outside = [n for n, m in sys.modules.items() if n.split(".")[0] == "sglang" and getattr(m, "__file__", None)
           and not os.path.abspath(m.__file__).startswith(os.path.abspath(sys.argv[1]))]
assert not outside, outside
print("ok")
"""


def core_missing() -> list[str]:
    """pyproject.toml's own dependencies that the host lacks (accelerate: weights straight onto the GPU)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [r for r in deps if re.split(r"[<>=!~ \[]", r)[0].lower() not in HOST_HAS]


def sglang_kernel_extra() -> list[str]:
    """The [sglang-kernels] extra of pyproject.toml, the light imports of SGLang's spec_tree, less what the
    host has (triton comes with its CUDA torch)."""
    return [r for r in extra("sglang-kernels") if r.lower() not in HOST_HAS]


def pip_download(reqs: list[str], dest: Path, deps: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", PYTHON,
           "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none", "--dest", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    if not deps:
        cmd.append("--no-deps")
    r = subprocess.run(cmd + reqs, capture_output=True, text=True)
    if r.returncode:
        tail = " ".join(r.stderr.split())[-400:]
        raise SystemExit(f"gpu_bundle: pip download failed for {' '.join(reqs)}: {tail}")


def wheel_name(path: Path) -> str:
    return path.name.split("-")[0].lower().replace("_", "-")


def download_wheels(dest: Path) -> list[str]:
    """-> names of the wheels dropped because the host has them."""
    dest.mkdir(parents=True, exist_ok=True)
    pip_download(NO_DEPS, dest, deps=False)
    pip_download([*core_missing(), *gpu_extra(), *NOTEBOOK, *sglang_kernel_extra(), *BUILD], dest, deps=True)
    dropped = []
    for w in sorted(dest.glob("*.whl")):
        name = wheel_name(w)
        if name in {h.replace("_", "-") for h in HOST_HAS} or name.startswith("nvidia-"):
            w.unlink()
            dropped.append(w.name)
    return dropped


def sglang_files() -> tuple[Path, list[Path]]:
    """(site-packages root of the installed sglang, the files the subset needs, relative to it)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gpu_bundle: sglang is not installed here; run `make install-sglang` first")
    pkg = Path(list(spec.submodule_search_locations)[0])
    site = pkg.parent
    r = subprocess.run([sys.executable, "-c", _PROBE, *SGLANG_MODULES], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"gpu_bundle: importing sglang's kernel modules failed: {r.stderr.strip().splitlines()[-1]}")
    files = {Path(f).resolve().relative_to(site.resolve()) for f in json.loads(r.stdout.strip().splitlines()[-1])}
    for d in SGLANG_JIT_DIRS:
        files |= {p.relative_to(site) for p in (pkg / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    return site, sorted(files)


def copy_subset(site: Path, files: list[Path], dest: Path) -> None:
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(site / rel, dest / rel)


INSTALL_SH = """#!/bin/sh
# Offline install of what the workbench needs on the GPU host; run with the host's Python 3.12:
#   sh install.sh [PYTHON]          (default: python3)
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${1:-python3}
"$PY" -m pip install --no-index --find-links "$HERE/wheels" --no-deps "$HERE"/wheels/dflash-0.1.0-*.whl
"$PY" -m pip install --no-index --find-links "$HERE/wheels" %(reqs)s
# SGLang's tree kernels without the 222 MB package: its subset goes on the path through a .pth file
# (where site-packages is not writable: export PYTHONPATH="$HERE/sglang-subset" instead).
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$HERE/sglang-subset" > "$SITE/ddtree-sglang-subset.pth"
"$PY" -c 'import sglang.kernels.ops.speculative.tree, tvm_ffi, ninja, plotly, ipywidgets, dflash.model
print("gpu bundle installed")'
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Assemble the offline GPU host bundle (wheels + sglang subset).")
    ap.add_argument("--out", required=True, help="folder to create (must not exist, or be empty)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"gpu_bundle: --out {out} exists and is not empty; give a new folder")
    work = Path(tempfile.mkdtemp(prefix=".gpu-bundle.", dir=out.parent if out.parent.exists() else None))
    try:
        dropped = download_wheels(work / "wheels")
        site, files = sglang_files()
        copy_subset(site, files, work / "sglang-subset")
        r = subprocess.run([sys.executable, "-c", _CHECK, str(work / "sglang-subset")], capture_output=True,
                           text=True, cwd=tempfile.gettempdir())
        if r.returncode or r.stdout.strip() != "ok":
            raise SystemExit(f"gpu_bundle: the sglang subset does not work on its own: {r.stderr.strip()[-400:]}")
        reqs = " ".join(f"'{q}'" for q in [*core_missing(), *gpu_extra(), *NOTEBOOK, *sglang_kernel_extra(), *BUILD])
        (work / "install.sh").write_text(INSTALL_SH % {"reqs": reqs})
        wheels = {w.name: w.stat().st_size for w in sorted((work / "wheels").glob("*.whl"))}
        subset = {str(f): (work / "sglang-subset" / f).stat().st_size for f in files}
        total = sum(wheels.values()) + sum(subset.values())
        manifest = {
            "python": PYTHON, "platforms": PLATFORMS, "no_deps": NO_DEPS, "core": core_missing(), "gpu": gpu_extra(),
            "notebook": NOTEBOOK, "sglang_kernels": sglang_kernel_extra(), "dropped_host_has": dropped,
            "sglang_modules": sorted(str(f) for f in files if f.suffix == ".py" and not str(f).startswith(
                tuple(f"sglang/{d}" for d in SGLANG_JIT_DIRS))),
            "wheels": wheels, "wheels_bytes": sum(wheels.values()),
            "sglang_subset_files": len(subset), "sglang_subset_bytes": sum(subset.values()), "total_bytes": total,
        }
        (work / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if total > LIMIT:
            big = sorted(wheels.items(), key=lambda kv: -kv[1])[:5]
            raise SystemExit(f"gpu_bundle: {total / 2**20:.1f} MiB is over the 64 MiB limit; largest wheels: "
                             + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in big))
        if out.exists():
            out.rmdir()
        os.replace(work, out)  # the bundle appears whole or not at all
    finally:
        if work.exists():
            shutil.rmtree(work)
    print(f"{out}: {len(wheels)} wheels {manifest['wheels_bytes'] / 2**20:.1f} MiB, sglang subset "
          f"{len(subset)} files {manifest['sglang_subset_bytes'] / 2**20:.2f} MiB, total {total / 2**20:.1f} MiB "
          f"(limit 64 MiB); copy it to the host and run `sh {out}/install.sh`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
