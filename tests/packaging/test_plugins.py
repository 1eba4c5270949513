"""A policy and an engine shipped by another package reach every door through entry points, with no edit to
this project: parsing and the registries, sessions, ``run``, ``bench``, the stepper, the served engine (its wire
and a live server), ``pays-off``'s input check and ``wb.compare``; and, pip-installed into a scratch venv (slow),
``python -m workbench run`` from that venv."""
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
    """The control: the same spelling with nothing installed (this process never loads the plugin: the tests above
    and below run it in subprocesses) is unknown, so the test above passes because of the entry points, not because
    something of ours already knows 'prefix'."""
    import workbench as wb

    with pytest.raises(ValueError, match="unknown policy 'prefix:3'"):
        wb.parse_policy("prefix:3")


DOORS = r"""
import contextlib, io, json, socket, sys
import workbench as wb
from workbench.cli import main
from workbench.engine.policies import parse_policy

def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue().strip()

got = {}
prefix = parse_policy("prefix:3")

# run: the plugin's policy on the plugin's engine, by name
rc, out, err = cli("run", "--engine", "slowref", "--policy", "prefix:3", "--prompt", "def parse(line):",
                   "--max-new-tokens", "12", "--json", "--threads", "1")
got["run"] = {"rc": rc, "err": err[-300:], **({k: json.loads(out)[k] for k in ("policy", "engine", "new_tokens")}
                                              if rc == 0 else {})}

# bench: the policy bench on the plugin's engine, the plugin's policy against AR
rc, out, err = cli("bench", "--engine", "slowref", "--policies", "ar,prefix:3", "--limit", "1", "--max-new-tokens",
                   "10", "--repeats", "1", "--no-warmup", "--check-lossless", "--json", "--quiet", "--threads", "1")
summary = json.loads(out) if rc == 0 else {}
got["bench"] = {"rc": rc, "err": err[-300:], "policies": summary.get("settings", {}).get("policies"),
                "lossless": summary.get("Prefix(3)", {}).get("lossless"), "tau": summary.get("Prefix(3)", {}).get("tau")}

# pays-off: its input check takes the plugin's spelling (a repeat is refused by name, before any model loads)
from workbench.payoff.inputs import check_inputs
from workbench.shipped import eval_prompts
inp = check_inputs([p["prompt"] for p in eval_prompts()[:10]], batch=(1,), policies="prefix:3,dflash")
rc, out, err = cli("pays-off", "--engine", "slowref", "--policies", "prefix:3,Prefix(3)")
got["pays_off"] = {"policies": [str(p) for p in inp.policies], "rc": rc, "err": err}

# the stepper: the plugin's policy in the menu (read from the registry), picked and its knob edited as a user would
from workbench.views.stepper import Stepper
e = wb.load(engine="slowref", threads=1)
s = e.session("def parse(line):", policy=wb.DDTree(4), max_new_tokens=16)
st = Stepper(s)
listed = [k for _, k in st.policy_kind.options]
st.policy_kind.value = "prefix"
picked = str(s.policy)
st.budget.value = 2
c = st.step()
got["stepper"] = {"listed": "prefix" in listed, "picked": picked, "edited": str(s.policy),
                  "knob": st.budget.description, "nodes": int(c.tokens.numel())}

# the served engine: the plugin's engine behind a live server, the plugin's policy over the wire
from workbench.serve import EngineServer, Limits, wire
w = wire.policy_from_wire(wire.loads(wire.dumps(wire.policy_to_wire(prefix))))
srv = EngineServer(e, port=0, limits=Limits(max_sessions=2, max_new_tokens=64, max_budget=48, session_ttl=60.0)).start()
try:
    rs = wb.connect(srv.url, token=srv.token).session("def parse(line):", policy=prefix, max_new_tokens=12)
    rs.run()
    local = e.session("def parse(line):", policy=prefix, max_new_tokens=12)
    local.run()
    got["served"] = {"wire": w == prefix, "policy": str(rs.policy), "same": list(rs.generated) == list(local.generated),
                     "cycles": len(rs.trace.cycles)}
finally:
    srv.stop()
with socket.socket() as busy:  # `serve --engine slowref` takes it; a port in use stops it before any load
    busy.bind(("127.0.0.1", 0)); busy.listen()
    rc, out, err = cli("serve", "--engine", "slowref", "--port", str(busy.getsockname()[1]))
got["serve_cli"] = {"rc": rc, "err": err}

# wb.compare: the report's other side loaded through the registry, never vLLM's constructor
r = wb.compare(engine="slowref", prompts=["def parse(line):", "class Node:"], max_new_tokens=8, repeats=1)
got["compare"] = {"engine": r.engine, "lossless": r.lossless, "runs": list(r.runs), "vllm": "vllm" in sys.modules}
print(json.dumps(got))
"""


def test_the_plugin_reaches_run_bench_the_stepper_the_served_engine_pays_off_and_compare(plugin_path):
    r = run_py(plugin_path, "-c", DOORS, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["run"]["rc"] == 0, got["run"]["err"]
    assert got["run"] == {"rc": 0, "err": "", "policy": "Prefix(3)", "engine": "slowref", "new_tokens": 12}
    assert got["bench"]["rc"] == 0, got["bench"]["err"]
    assert got["bench"]["policies"] == ["AR", "Prefix(3)"] and got["bench"]["lossless"] is True
    assert got["bench"]["tau"] > 1  # it speculated
    assert got["pays_off"]["policies"] == ["Prefix(3)", "DFlash"]
    assert got["pays_off"]["rc"] == 2
    assert got["pays_off"]["err"] == "workbench: error: policies='prefix:3,Prefix(3)': Prefix(3) is listed twice"
    st = got["stepper"]
    assert st["listed"] and st["picked"] == "Prefix(4)" and st["edited"] == "Prefix(2)" and st["knob"] == "depth"
    assert st["nodes"] <= 3  # the chain cut to 2 drafted slots, root included
    assert got["served"] == {"wire": True, "policy": "Prefix(3)", "same": True, "cycles": got["served"]["cycles"]}
    assert 0 < got["served"]["cycles"] < 12
    assert got["serve_cli"]["rc"] == 2 and "cannot listen on 127.0.0.1:" in got["serve_cli"]["err"]
    c = got["compare"]
    assert c["engine"] == "slowref" and c["runs"] == ["workbench AR", "workbench DFlash", "slowref DFlash"]
    assert c["lossless"] == {"workbench DFlash vs workbench AR": "2/2 prompts", "slowref DFlash vs workbench AR": "2/2 prompts"}
    assert c["vllm"] is False  # nothing of vLLM was imported, let alone constructed


@pytest.mark.slow
def test_pip_installed_into_a_scratch_venv_it_reaches_the_command_line(tmp_path):
    """What a user does: pip-install the package (its own pyproject, entry points in its metadata) into a venv,
    then run the workbench from that venv with the plugin's policy on the plugin's engine. No PYTHONPATH: the
    entry points are found in the venv's site-packages."""
    from scratch_plugin import write_package

    src = write_package(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # --system-site-packages reaches the base interpreter's packages; this project's (torch, the workbench
    # itself, pip, setuptools) live in the environment running the tests, which the scratch venv sees the same
    # way: through its site directory, as a later layer.
    parent = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "workbench_env.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    pip = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                          str(src)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    where = subprocess.run([str(py), "-c", "import scratch_wb; print(scratch_wb.__file__)"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=120)
    assert where.returncode == 0 and Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr
    r = subprocess.run([str(py), "-m", "workbench", "run", "--policy", "prefix:3", "--engine", "slowref", "--prompt",
                        "def parse(line):", "--max-new-tokens", "12", "--json", "--threads", "1"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert (out["policy"], out["engine"], out["new_tokens"]) == ("Prefix(3)", "slowref", 12)
    assert out["cycles"] < 12  # it speculated through the plugin's tree


def test_a_broken_plugin_is_one_line_naming_it_and_does_not_stop_the_workbench_under_W_error(tmp_path):
    site = install(tmp_path)
    (site / "scratch_wb" / "policy.py").write_text("raise RuntimeError('half-installed')\n")
    probe = "import workbench as wb; print(wb.parse_policy('ddtree:4'))"
    for flags in (["-W", "error"], ["-W", "always"], []):
        r = run_py(site, *flags, "-c", probe)
        assert r.returncode == 0 and r.stdout.strip() == "DDTree(4)", (flags, r.stderr[-2000:])
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, (flags, r.stderr)
        assert "workbench.policies plugin 'prefix' (scratch_wb.policy) failed to import: RuntimeError: " \
               "half-installed" in lines[0] and "policies/__init__.py" not in lines[0], lines[0]
    # its words filter it, as any warning's do (-W), and so does its category, under an error filter that would
    # otherwise raise (the second import of the broken module warns again)
    r = run_py(site, "-W", "ignore:workbench.policies plugin", "-c",
               probe + "; import warnings; warnings.simplefilter('error'); "
                       "from workbench.interface.plugins import PluginWarning, import_declared; "
                       "warnings.simplefilter('ignore', PluginWarning); import_declared('workbench.policies'); "
                       "print(issubclass(PluginWarning, UserWarning))")
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    assert r.stdout.split() == ["DDTree(4)", "True"], r.stdout


@pytest.mark.parametrize("entry, words", [
    ("scratch_wb.nosuch:SlowRef", "module scratch_wb.nosuch is not there: scratch_wb is installed"),
    ("scratch_wb.engine:NoSuch", "scratch_wb.engine has no 'NoSuch'"),
])
def test_an_engine_entry_point_naming_what_is_not_there_says_what_is_missing(tmp_path, entry, words):
    site = install(tmp_path)
    info = site / "scratch_wb-0.1.dist-info" / "entry_points.txt"
    info.write_text(info.read_text().replace("scratch_wb.engine:SlowRef", entry))
    r = run_py(site, "-m", "workbench", "run", "--engine", "slowref", "--prompt", "x", "--max-new-tokens", "4")
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and "pip install" not in lines[0], r.stderr[-2000:]
    assert "'slowref'" in lines[0] and entry in lines[0]
