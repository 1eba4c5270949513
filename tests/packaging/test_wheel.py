"""A wheel of the package works as well as the editable install, with only what it declares.

The wheel is built from this checkout and installed without its dependencies into a fresh virtual
environment; the distributions its metadata requires (Requires-Dist without an extra, followed through
theirs) are linked in from the CPU venv, and nothing else: no extra, no dflash. There, from outside the
checkout: loading a pair and every CLI command that needs an extra say so in one line naming the pip
command; with dflash added as its extra's note says (``--no-deps``), both embedded pairs load from the
installed package data and run a cycle."""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

CLI = r"""
import contextlib, importlib.util, io, json, sys
import workbench as wb, ddtree_kernels
from workbench.cli import main
from workbench.extras import EXTRA_OF
prefix, bench_file, expected = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for mod in (wb, ddtree_kernels):
    assert mod.__file__.startswith(prefix), f"{mod.__name__} imported from {mod.__file__}, not the wheel"
present = [m for m in EXTRA_OF if m != "dflash" and importlib.util.find_spec(m) is not None]
assert not present, f"not a core-only environment: {present}"
if "load" in expected:
    try:
        wb.load()
        raise AssertionError("wb.load() ran without dflash")
    except ImportError as e:
        print("load:", e)
COMMANDS = {"run": ["run", "--prompt", "def f():", "--max-new-tokens", "2"], "serve": ["serve"],
            "report": ["report", bench_file], "bench-vllm": ["bench", "--engine", "vllm", "--max-new-tokens", "4"],
            "bench-serve": ["bench-serve"]}
for name in expected:
    if name == "load":
        continue
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(COMMANDS[name])
    print(f"{name}:", code, err.getvalue().strip().splitlines()[-1])
"""

WITH_DFLASH = r"""
import sys
import workbench as wb
for name in ("dense", "hybrid"):
    engine = wb.load() if name == "dense" else wb.load(name)
    s = engine.session("def parse(line):", policy=wb.DDTree(budget=8), temperature=0.0, seed=0)
    c = s.step()
    assert c.committed >= 1, c
    print(name, "ok", c.committed)
"""


def declared_closure(requires: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions ``requires`` (Requires-Dist lines) need, without any extra: what pip
    would install for the wheel, as the CPU venv holds them."""
    out: dict = {}
    todo = [Requirement(r) for r in requires]
    while todo:
        r = todo.pop()
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        key = canonicalize_name(r.name)
        if key in out:
            continue
        out[key] = importlib.metadata.distribution(r.name)
        todo += [Requirement(x) for x in out[key].requires or []]
    return out


def link_in(dist: importlib.metadata.Distribution, site: Path) -> None:
    """``dist``'s top-level files and folders (its packages, its .dist-info) linked into ``site``."""
    tops = {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".."}
    for top in tops:
        if not (site / top).exists():
            (site / top).symlink_to(dist.locate_file(top))


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


def test_the_wheel_with_only_what_it_declares(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
                    str(wheel)], check=True, capture_output=True)
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    declared = Parser().parsestr(zipfile.ZipFile(wheel).read(meta).decode()).get_all("Requires-Dist") or []
    closure = declared_closure(declared)
    assert "dflash" not in closure and "fastapi" not in closure  # extras, not dependencies
    for dist in closure.values():
        link_in(dist, site)
    bench_file = tmp_path / "bench.jsonl"  # `report` imports its page writer before it reads a row
    bench_file.write_text("{}\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(script: str, *args: str) -> str:
        r = subprocess.run([str(py), "-c", script, str(site), *args], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    pip = {extra: f"pip install 'ddtree-workbench[{extra}]'" for extra in ("dflash", "serve", "notebook", "vllm")}
    # Only the declared dependencies: loading a pair, and every command, names the extra it lacks.
    core = {"load": "dflash", "run": "dflash", "serve": "serve", "report": "notebook", "bench-vllm": "vllm",
            "bench-serve": "serve"}
    # dflash added (--no-deps, as its extra's note says): the others still name theirs.
    with_dflash = {"serve": "serve", "report": "notebook", "bench-vllm": "vllm", "bench-serve": "serve"}
    for step, expected in (("core", core), ("dflash", with_dflash)):
        if step == "dflash":
            link_in(importlib.metadata.distribution("dflash"), site)
        out = run(CLI, str(bench_file), json.dumps(expected))
        lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
        for name, extra in expected.items():
            code, _, text = lines[name].partition(" ") if name != "load" else ("2", "", lines[name])
            assert code == "2" and pip[extra] in text and "Traceback" not in text, (step, name, lines[name])
    out = run(WITH_DFLASH)
    assert "dense ok" in out and "hybrid ok" in out, out
