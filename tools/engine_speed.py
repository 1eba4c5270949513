"""The engine's speed before and after a change, each beside the plain reference decoder, in one run.

    .venv/bin/python tools/engine_speed.py                      # HEAD^ against HEAD
    .venv/bin/python tools/engine_speed.py BEFORE AFTER --rounds 3

Run it whenever ``workbench/engine/``, ``workbench/models/`` or ``kernels/`` change, on an idle machine
(it refuses a busy one: ``--busy-ok`` to measure anyway). Each commit is checked out into its own git
worktree and imported from there (its ``kernels/`` as ``ddtree_kernels``). Rounds alternate which side
goes first (ABBA), so drift hits both. In every round each side decodes the held-out prompts (the long
split's prompts 20-31, 64 tokens, greedy, one thread) with the engine's DDTree(budget) and with
``reference_generate``, prompt by prompt, and checks the tokens are the same.

Printed per budget: each side's speed over the reference (reference wall time / engine wall time over
the same tokens; > 1 = the engine faster), the median and range over the prompts, and after / before
with a paired Wilcoxon signed-rank test over the 12 prompts (each prompt's median over the rounds).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = (16, 32, 64)
PROMPTS = slice(20, 32)  # held out: never trained, calibrated or tuned on
MAX_NEW_TOKENS = 64
BUSY_LOAD = 0.5  # 1-minute load average above which timings are not trusted

# One side's round, run inside that side's worktree: per budget and prompt, engine and reference wall times.
SIDE = r"""
import json, sys, time, torch
torch.set_num_threads(1)
import workbench as wb
from workbench.bench.plain_decoder import reference_generate
from workbench.engine.prompting import encode_prompt
budgets, prompts, n = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
engine = wb.load(threads=1)
out = {}
def ours(prompt, b):
    t0 = time.perf_counter()
    s = engine.session(prompt, policy=wb.DDTree(b), temperature=0.0, max_new_tokens=n)
    s.run()
    return time.perf_counter() - t0, list(s.generated)
for b in budgets:
    ours(prompts[0], b), reference_generate(engine.models, prompts[0], b, 16)  # warm-up
    rows = []
    for i, p in enumerate(prompts):
        first_ours = i % 2 == 0
        if first_ours:
            (te, toks) = ours(p, b)
        t0 = time.perf_counter(); ref = reference_generate(engine.models, p, b, n); tr = time.perf_counter() - t0
        if not first_ours:
            (te, toks) = ours(p, b)
        rows.append({"engine": te, "reference": tr, "same": toks == ref.tokens, "tokens": len(toks)})
    out[str(b)] = rows
print(json.dumps(out))
"""


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(rev: str) -> str:
    try:
        return _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"engine_speed: {rev!r} is not a commit here; give a commit, branch or tag (git log --oneline)")


def _side(work: Path, name: str, rev: str) -> tuple[Path, dict]:
    tree = work / name
    _git("worktree", "add", "--detach", str(tree), rev)
    path = work / f"{name}-path"
    path.mkdir()
    (path / "ddtree_kernels").symlink_to(tree / "kernels")
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{path}", "OMP_NUM_THREADS": "1"}
    return tree, env


def _round(tree: Path, env: dict, prompts: list[str]) -> dict:
    got = subprocess.run([sys.executable, "-c", SIDE, json.dumps(BUDGETS), json.dumps(prompts), str(MAX_NEW_TOKENS)],
                         cwd=tree, env=env, capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"engine_speed: the side at {tree.name} failed:\n{got.stderr[-2000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def _speeds(rounds: list[dict], budget: str) -> tuple[list[float], bool, float]:
    """Per prompt: the median over rounds of reference / engine wall; whether every run had the same tokens;
    the pooled speed (all reference time over all engine time)."""
    per = [[r[budget][i]["reference"] / r[budget][i]["engine"] for r in rounds] for i in range(len(rounds[0][budget]))]
    same = all(row["same"] for r in rounds for row in r[budget])
    pooled = sum(row["reference"] for r in rounds for row in r[budget]) / sum(
        row["engine"] for r in rounds for row in r[budget])
    return [statistics.median(p) for p in per], same, pooled


def report(before: list[dict], after: list[dict]) -> str:
    from scipy.stats import wilcoxon

    lines = ["engine speed over the reference decoder (reference wall / engine wall, same tokens; > 1 = engine faster)",
             f"{'budget':<8}{'before: pooled  median [min-max]':<36}{'after: pooled  median [min-max]':<36}"
             f"{'after/before':>13}{'p':>8}  same tokens"]
    for b in map(str, BUDGETS):
        (sb, same_b, pb), (sa, same_a, pa) = _speeds(before, b), _speeds(after, b)
        ratio = statistics.median(a / x for a, x in zip(sa, sb))
        p = wilcoxon(sa, sb).pvalue if any(a != x for a, x in zip(sa, sb)) else 1.0
        cell = lambda s, pooled: f"{pooled:.3f}  {statistics.median(s):.3f} [{min(s):.2f}-{max(s):.2f}]"
        lines.append(f"{b:<8}{cell(sb, pb):<36}{cell(sa, pa):<36}{ratio:>13.3f}{p:>8.3f}  "
                     f"{'yes' if same_b and same_a else 'NO'}")
    lines.append(f"p: paired Wilcoxon signed-rank over {len(sa)} prompts (each the median of {len(after)} rounds)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", nargs="?", default="HEAD^")
    ap.add_argument("after", nargs="?", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy-ok", action="store_true", help="measure although the machine is busy")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        raise SystemExit(f"engine_speed: --rounds {a.rounds}: give 1 or more (3 is the default)")
    revs = _commit(a.before), _commit(a.after)
    load = os.getloadavg()[0]
    if load > BUSY_LOAD and not a.busy_ok:
        raise SystemExit(f"engine_speed: the machine is busy (load {load:.2f} > {BUSY_LOAD}); stop other work "
                         "and rerun, or pass --busy-ok to measure anyway")
    lines = (ROOT / "workbench/assets/eval_prompts.jsonl").read_text().splitlines()
    prompts = [json.loads(x)["prompt"] for x in lines][PROMPTS]
    work = Path(tempfile.mkdtemp(prefix="engine-speed."))
    sides = {}
    try:
        for name, rev in zip(("before", "after"), revs):
            sides[name] = _side(work, name, rev)
        results = {"before": [], "after": []}
        for r in range(a.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for name in order:
                results[name].append(_round(*sides[name], prompts))
            print(f"round {r + 1}/{a.rounds} done (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
    finally:
        for name in sides:
            _git("worktree", "remove", "--force", str(work / name))
        shutil.rmtree(work, ignore_errors=True)
    print(f"before {revs[0][:10]}  after {revs[1][:10]}")
    print(report(results["before"], results["after"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
