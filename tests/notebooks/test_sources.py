"""Notebook sources are files: each notebook's cells live in ``notebooks/NN_name.py`` (jupytext's
percent format), the committed .ipynb is that source's build, and a source is Python that imports no test helper
and no private name."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from shared_checks import load_script

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
# the helper modules beside tests/conftest.py (importable only through a sys.path hack)
TEST_HELPERS = {"tests", "conftest", "shared_checks", "tiny_models", "tiny_hybrid", "real_layouts", "vllm_pairs"}


def builder():
    return load_script(NOTEBOOKS / "build.py", "nb_build")


def source_problems(text: str) -> list[str]:
    """What a notebook source must not do: fail to compile, reach into tests/ (a ``sys.path`` edit or a test
    helper's import), or import a private name (``_name``) from another module."""
    try:
        tree = ast.parse(text)
        compile(tree, "<notebook source>", "exec")
    except SyntaxError as e:
        return [f"line {e.lineno}: {e.msg}"]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys":
            out.append(f"line {node.lineno}: sys.path (a notebook imports the package, not files beside it)")
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
            names = []
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            mods, names = [node.module or ""], [a.name for a in node.names]
        else:
            continue
        for m in mods:
            if m.split(".")[0] in TEST_HELPERS:
                out.append(f"line {node.lineno}: imports the test helper {m}")
            if any(part.startswith("_") for part in m.split(".")):
                out.append(f"line {node.lineno}: imports the private module {m}")
        out += [f"line {node.lineno}: imports the private name {n} from {mods[0]}" for n in names if n.startswith("_")]
    return sorted(out, key=lambda p: int(p.split()[1].rstrip(":")))


def test_every_notebook_has_a_source_and_every_source_a_notebook():
    built = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    assert built and built == list(builder().sources()), "a notebook without a source, or a source never built"


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")))
def test_every_notebook_is_its_source(name):
    """The committed notebook's cells (the run-time note aside) are its source's cells, type and text, in order:
    a source edited without `python notebooks/build.py NN`, or a notebook edited in Jupyter only, fails."""
    mod = builder()
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    assert mod.stale_cells(nb, mod.source_cells(NOTEBOOKS / f"{name}.py")) == []


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.py")))
def test_every_source_compiles_and_imports_no_test_helper_or_private_name(name):
    assert source_problems((NOTEBOOKS / f"{name}.py").read_text()) == []


def test_the_checks_name_a_planted_fault(tmp_path):
    """Each check fails on the fault it is meant to find."""
    mod = builder()
    src = NOTEBOOKS / "01_quickstart.py"
    nb = json.loads((NOTEBOOKS / "01_quickstart.ipynb").read_text())
    edited = tmp_path / "01_quickstart.py"
    edited.write_text(src.read_text().replace("max_new_tokens=64", "max_new_tokens=65", 1))
    diff = mod.stale_cells(nb, mod.source_cells(edited))
    assert len(diff) == 1 and diff[0].startswith("cell ") and "the source code" in diff[0], diff
    assert mod.stale_cells(nb, mod.source_cells(src)[:-1])[-1].endswith("in the source")
    planted = ("# %%\nimport sys\nsys.path.insert(0, '../tests')\nfrom real_layouts import write_qwen3\n"
               "from workbench.shapes.sglang_source import _parsed\nimport workbench._hidden\n# %%\ndef f(:\n")
    assert source_problems(planted) == ["line 8: invalid syntax"]
    problems = source_problems(planted.rsplit("# %%", 1)[0])
    assert [p.split(":")[1].split()[0] for p in problems] == ["sys.path", "imports", "imports", "imports"], problems
    assert "test helper real_layouts" in problems[1] and "private name _parsed" in problems[2]
    assert "private module workbench._hidden" in problems[3]


def test_build_refuses_an_unknown_notebook_with_the_known_ones():
    with pytest.raises(SystemExit, match="no notebook source starts with '99': one of 01_quickstart"):
        builder().main(["99"])


def test_nbval_collects_every_notebook_and_no_source():
    """`make test` runs every notebook under nbval; a source beside it is not mistaken for a test module."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0",
                        "notebooks"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    collected = {line.split("::")[0] for line in r.stdout.splitlines() if "::" in line}
    assert collected == {f"notebooks/{p.name}" for p in NOTEBOOKS.glob("*.ipynb")}
