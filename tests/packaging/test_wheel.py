"""A wheel of the package works as well as the editable install.

The wheel is built from this checkout, installed without its dependencies into a fresh virtual
environment that sees the CPU venv's site-packages (a .pth line: the dependencies, not the editable
workbench, whose finder is only read from a site directory's own .pth files), and imported from
outside the checkout: both embedded pairs load from the installed package data and run a cycle."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

SCRIPT = r"""
import sys
import workbench as wb, ddtree_kernels
prefix = sys.argv[1]
for mod in (wb, ddtree_kernels):
    assert mod.__file__.startswith(prefix), f"{mod.__name__} imported from {mod.__file__}, not the wheel"
for name in ("dense", "hybrid"):
    engine = wb.load() if name == "dense" else wb.load(name)
    s = engine.session("def parse(line):", policy=wb.DDTree(budget=8), temperature=0.0, seed=0)
    c = s.step()
    assert c.committed >= 1, c
    print(name, "ok", c.committed)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # From a copy without build outputs: setuptools reuses a stale build/lib, which would hide a package
    # that the configuration leaves out.
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv*", "build", "dist", "*.egg-info", ".git",
                                                            "__pycache__", "distill.pt", "out"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True, cwd=out, capture_output=True)
    (whl,) = out.glob("ddtree_workbench-*.whl")
    return whl


def test_wheel_holds_every_package_and_asset(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "workbench").rglob("__init__.py")}
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, f"packages missing from the wheel: {missing}"
    assets = {p.relative_to(ROOT).as_posix() for p in (ROOT / "workbench" / "assets").rglob("*")
              if p.is_file() and p.name != "distill.pt"}
    missing = sorted(assets - names)
    assert not missing, f"assets missing from the wheel: {missing}"
    kernels = {f"ddtree_kernels/{p.name}" for p in (ROOT / "kernels").glob("*.py")}
    assert kernels <= names, sorted(kernels - names)


def test_wheel_installs_imports_and_runs_both_pairs(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # The CPU venv's packages come after the wheel's own site directory.
    (site / "cpu_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
                    str(wheel)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(py), "-c", SCRIPT, str(site)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "dense ok" in run.stdout and "hybrid ok" in run.stdout, run.stdout
