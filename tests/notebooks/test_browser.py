"""The Stepper in a real browser: JupyterLab on loopback, Debian's Chromium driven by Playwright.

Writes a notebook (in a temporary folder) that shows a Stepper on a tiny random model pair,
runs all cells, clicks Step, and checks the tree figure's node count on the page changed.
Skips only when Chromium or Playwright is not installed (``apt-get install chromium``;
``pip install playwright`` -- never ``playwright install``, browsers are not downloaded).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# Sum of points over the tree figure's node traces (trace.meta == "nodes"), for every plot on the page.
NODE_COUNT_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd =>
    (gd.data || []).filter(t => t.meta === 'nodes').reduce((a, t) => a + ((t.x && t.x.length) || 0), 0))"""


def chromium_path() -> str | None:
    for p in (os.environ.get("WORKBENCH_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
              shutil.which("chromium-browser")):
        if p and Path(p).exists():
            return p
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def notebook(target: Path, draft: Path) -> dict:
    def code(src: str) -> dict:
        return {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": src}

    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "cells": [
            code("import torch\ntorch.set_num_threads(1)\nimport workbench as wb\n"
                 f"engine = wb.load(target={str(target)!r}, draft={str(draft)!r})"),
            code('stepper = wb.Stepper(engine.session("t1 t2 t3", policy=wb.DDTree(8), max_new_tokens=40))\n'
                 "stepper"),
        ],
    }


@pytest.fixture
def lab_server(tmp_path, tiny_pairs):
    """JupyterLab on 127.0.0.1 with a random token, serving a folder with the stepper notebook."""
    target, draft = tiny_pairs["l4-h32"]
    root = tmp_path / "lab"
    root.mkdir()
    (root / "stepper.ipynb").write_text(json.dumps(notebook(target, draft)))
    # Lab settings for the run: start the notebook's kernel without asking, and never fetch news.
    settings = tmp_path / "settings"
    for plugin, value in [("notebook-extension/tracker", {"autoStartDefaultKernel": True}),
                          ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False})]:
        f = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    token, port = secrets.token_hex(16), free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), PYTHONPATH=str(Path(__file__).parents[2]))
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--ServerApp.root_dir={root}", "--LabApp.news_url=", "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {(tmp_path / 'lab.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not start: {(tmp_path / 'lab.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield url, token, tmp_path / "lab.log"
    finally:
        # The server and its kernels are in their own process group; end that group only.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        log.close()


@pytest.fixture
def chromium_exe():
    """Debian's Chromium and Playwright for Python, or a skip that says which is missing."""
    exe = chromium_path()
    if exe is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); the browser test needs it")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright, the [test] extra)")
    return exe


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_stepper_step_in_jupyterlab(chromium_exe, lab_server):  # chromium_exe first: skip before starting Lab
    from playwright.sync_api import sync_playwright

    exe = chromium_exe
    url, token, log = lab_server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/lab/tree/stepper.ipynb?token={token}", timeout=60_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            # Wait for the kernel, then Run > Run All Cells.
            # The status bar reads "Python 3 (ipykernel) | Idle" once the kernel is up; clicking Run All
            # earlier can interrupt a kernel that is still starting.
            page.get_by_text(re.compile(r"\| Idle$")).first.wait_for(timeout=60_000)
            page.locator(".lm-MenuBar-item", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile(r"^Run All Cells$")).click()
            step = page.get_by_role("button", name="Step", exact=True)
            deadline = time.monotonic() + 60
            while not step.is_visible():
                accept = page.locator(".jp-Dialog .jp-mod-accept")  # a kernel dialog, if Lab asks anyway
                if accept.count() and accept.first.is_visible():
                    accept.first.click()
                assert time.monotonic() < deadline, "the Stepper's Step button did not appear within 60 s"
                page.wait_for_timeout(250)
            page.wait_for_function(f"() => ({NODE_COUNT_JS})().length >= 1", timeout=30_000)
            before = page.evaluate(NODE_COUNT_JS)
            assert max(before) == 0, f"no cycle has run yet, but the page shows nodes: {before}"
            step.click()
            page.wait_for_function(f"() => Math.max(...({NODE_COUNT_JS})()) > 0", timeout=30_000)
            after = page.evaluate(NODE_COUNT_JS)
            # DDTree(8) on the tiny pair: up to 8 drafted nodes + the root + the bonus
            assert 2 < max(after) <= 8 + 2, after
            title = page.evaluate("() => Array.from(document.querySelectorAll('.js-plotly-plot .gtitle'))"
                                  ".map(e => e.textContent)")
            assert any(t.startswith("cycle 0") for t in title), title
            step.click()
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.js-plotly-plot .gtitle'))"
                ".some(e => e.textContent.startsWith('cycle 1'))", timeout=30_000)
            assert not [e for e in errors if "plotly" in e.lower() or "widget" in e.lower()], errors
        except Exception:
            try:
                page.screenshot(path=str(log.parent / "failure.png"))
            except Exception:
                pass
            print(log.read_text()[-3000:])
            raise
        finally:
            browser.close()
