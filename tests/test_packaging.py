"""Set-up files agree with each other; CI runs the README's test command."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pyproject_requirements() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(data["dependencies"])
    for extra in data["optional-dependencies"].values():  # in file order: sglang-kernels, test, gpu
        reqs += extra
    return reqs


def environment_pip() -> list[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    out = []
    for line in lines[start + 1 :]:
        m = re.match(r"^\s{6,}- (\S+)\s*$", line)
        if m:
            out.append(m.group(1))
    return out


def test_environment_yml_mirrors_pyproject():
    assert environment_pip() == pyproject_requirements()


def test_torch_is_pinned_to_the_cpu_wheel_version():
    assert "torch==2.13.0" in pyproject_requirements()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make lab" in readme
    commands = [line for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1].strip() == "make test"


def test_lab_binds_loopback_and_keeps_auth():
    mk = (ROOT / "Makefile").read_text()
    lab = mk.split("\nlab:")[1].split("\n\n")[0]
    assert "--ServerApp.ip=127.0.0.1" in lab
    assert "token=''" not in lab and 'token=""' not in lab and "disable_check_xsrf" not in lab


def test_kernels_import_name_is_not_bare_kernels():
    import ddtree_kernels

    assert Path(ddtree_kernels.__file__).parent.name == "kernels"
