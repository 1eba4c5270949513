"""A policy and an engine shipped by another package reach every door through entry points, with no edit to
this project: parsing and the registries, sessions, the CLI's commands, the served engine's wire."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scratch_plugin import install

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    return install(tmp_path_factory.mktemp("site"))


def run_py(plugin_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(plugin_path), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


PROBE = r"""
import json, workbench as wb
from workbench.engine.policies import registered, choices, to_wire, from_wire
from workbench.interface.registry import engine_names
p = wb.parse_policy("prefix:3")
e = wb.load(engine="slowref", threads=1)
ids = e.encode("def parse(line):").ids
a = e.session(prompt_ids=ids, policy=wb.AR(), max_new_tokens=24); a.run()
b = e.session(prompt_ids=ids, policy=p, max_new_tokens=24); b.run()
print(json.dumps({"policy": repr(p), "kinds": list(registered()), "engines": engine_names(),
                  "engine": type(e).__name__, "name": e.name, "same": a.generated == b.generated,
                  "cycles": len(b.trace.cycles), "wire": from_wire(to_wire(p)) == p,
                  "usage": "prefix:N" in wb.engine.policies.usages()}))
"""


def test_a_plugin_policy_and_engine_reach_parsing_sessions_and_the_wire(plugin_path):
    r = run_py(plugin_path, "-c", PROBE)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["policy"] == "Prefix(depth=3)" or "Prefix" in got["policy"]
    assert "prefix" in got["kinds"] and "slowref" in got["engines"]
    assert got["engine"] == "SlowRef" and got["name"] == "slowref"
    assert got["same"] and got["cycles"] < 24  # lossless, and it speculated (fewer cycles than tokens)
    assert got["wire"] and got["usage"]


def test_without_the_plugin_its_spellings_are_unknown():
    """The control: the same probe with nothing installed fails on the plugin's spelling (so the test above
    passes because of the entry points, not because something of ours already knows 'prefix')."""
    r = subprocess.run([sys.executable, "-c", "import workbench as wb; wb.parse_policy('prefix:3')"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0 and "unknown policy 'prefix:3'" in r.stderr


def test_a_broken_plugin_is_named_in_one_warning_and_the_workbench_still_starts(tmp_path):
    site = install(tmp_path)
    (site / "scratch_wb" / "policy.py").write_text("raise RuntimeError('half-installed')\n")
    r = run_py(site, "-W", "always", "-c", "import workbench as wb; print(wb.parse_policy('ddtree:4'))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "DDTree(4)"
    assert "workbench.policies plugin 'prefix' (scratch_wb.policy) failed to import: RuntimeError: half-installed" \
        in r.stderr
