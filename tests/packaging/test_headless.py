"""The engine, the CLI's run/bench and tests/gpu/check_cuda.py work without the notebook stack.

A subprocess hides plotly, ipywidgets and anywidget behind a ``sys.meta_path`` blocker (as on a
headless GPU host that has only torch, transformers, tokenizers, safetensors, dflash and numpy),
then runs the engine and the CLI; ``wb.views`` / ``wb.Stepper`` must fail with a message naming
the missing package.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from workbench.records.cycle import STAGES

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import importlib.abc, io, json, runpy, sys, contextlib
HIDDEN = ("plotly", "ipywidgets", "anywidget")

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
target, draft, prompts, check_cuda = sys.argv[1:5]
out = {}
import workbench as wb
from workbench.cli import main

e = wb.load(target=target, draft=draft, threads=1)
s = e.session("t1 t5 t9", policy=wb.DDTree(8), max_new_tokens=12)
s.run()
a = e.session("t1 t5 t9", policy=wb.AR(), max_new_tokens=12)
a.run()
out["lossless"] = s.tokens == a.tokens
out["divergence"] = repr(wb.first_divergence(s, a))
model = ["--target", target, "--draft", draft, "--threads", "1"]
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    out["run_rc"] = main(["run", "--prompt", "t1 t2", "--max-new-tokens", "6", "--json", *model])
    out["bench_rc"] = main(["bench", "--policies", "ar,ddtree:4", "--prompts", prompts, "--max-new-tokens", "6",
                            "--no-warmup", "--check-lossless", "--json", "--no-progress", *model])
out["run_json"] = json.loads(buf.getvalue().splitlines()[0])
for name in ("views", "Stepper"):
    try:
        getattr(wb, name)
        out[name] = "imported"
    except ImportError as err:
        out[name] = str(err)
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        sys.argv = [check_cuda]
        runpy.run_path(check_cuda, run_name="__main__")
        out["check_cuda_rc"] = None
    except SystemExit as ex:
        out["check_cuda_rc"] = ex.code
out["check_cuda_out"] = buf.getvalue()
out["hidden_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
print("RESULT " + json.dumps(out))
'''


def test_engine_cli_and_gpu_check_run_without_plotly_and_ipywidgets(tiny_pairs, tmp_path):
    t, d = tiny_pairs["l4-h32"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "t1 t5 t9 t3"}\n')
    args = [str(t), str(d), str(prompts), str(ROOT / "tests/gpu/check_cuda.py")]
    r = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["hidden_loaded"] == []
    assert out["lossless"] and out["divergence"] == "None"
    assert out["run_rc"] == 0 and out["bench_rc"] == 0 and out["run_json"]["new_tokens"] == 6
    for name in ("views", "Stepper"):
        msg = out[name]  # one line: what needs it, the package, the install that brings it
        assert msg.startswith("workbench.views") and "\n" not in msg, msg
        assert "needs the 'plotly' package" in msg and "pip install 'ddtree-workbench[notebook]'" in msg, msg
    assert out["check_cuda_rc"] == 0 and "no CUDA" in out["check_cuda_out"]


def test_gpu_check_sections_run_on_the_cpu(tiny_pairs, monkeypatch):
    """tests/gpu/check_cuda.py's sections, pointed at the CPU (the CUDA JIT and sync checks aside), so the
    GPU check's own code is exercised here before it first runs on a GPU host."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "gpu"))
    import check_cuda as cc
    import workbench as wb

    models = tuple(str(x) for x in tiny_pairs["l4-h32"])
    prompts = ["t1 t5 t9", "t40 t2 t17"]
    r = cc.accept_backends(n_batches=6, device="cpu")
    assert r["ok"] and r["agree"] == "6/6" and "Triton interpreter" in r["kernel"]
    r = cc.fp32_cuda_vs_cpu(wb, models, prompts, 10, device="cpu")
    assert r == {"ok": True, "equal": "2/2"}
    r = cc.bf16_vs_ar(wb, models, prompts, 10, device="cpu", backend="torch")  # the interpreter is slow
    assert r["ok"] and r["equal_own_ar"].endswith("/2") and r["kernel_backend"] == "torch"
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    eng, used, note = cc.load_bf16(wb, models, "cpu", "sglang")  # the kernel cannot load: falls back, says why
    assert used == "torch" and eng.kernel_backend == "torch" and "needs the 'sglang' package" in note
    monkeypatch.setattr(importlib.util, "find_spec", real)
    r = cc.stages(wb, models, prompts[:1], 8, device="cpu", budgets=(4, 8), backend="torch")
    assert set(r["ddtree4"]) == {*STAGES, "tau"}
    assert all(p50 <= p90 for k, (p50, p90) in ((k, v) for k, v in r["ddtree8"].items() if k != "tau"))
    report = {}
    cc.run_section(report, "broken", lambda: 1 / 0)
    assert report["broken"]["ok"] is False and report["broken"]["error"].startswith("ZeroDivisionError")
    assert json.loads(cc.one_screen(report)) == report
