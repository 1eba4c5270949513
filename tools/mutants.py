"""Curated mutation testing: plant one plausible one-line bug at a time and see whether the tests notice.

    make mutants                                    # every mutant, against the test files covering its code
    .venv/bin/python tools/mutants.py --list         # the mutants, by module
    .venv/bin/python tools/mutants.py -k sampling    # mutants whose id or module contains "sampling"
    .venv/bin/python tools/mutants.py --only sampling.top_p_untempered,records.accepted_off_by_one

Nothing is planted in this checkout. The repository is copied (without .venv, .git and caches) to a work
folder (``--work``, default /tmp/mutants-work); each mutant edits one file there, the covering tests run there
with this checkout's interpreter, and the file is restored byte for byte in a ``finally`` (also on Ctrl-C,
SIGTERM or an error), then checked against its original bytes. The copy is imported, not this checkout: the
editable install maps ``workbench`` and ``ddtree_kernels`` to this checkout, so the copy goes first on
PYTHONPATH and ``ddtree_kernels`` is a symlink to the copy's ``kernels/`` there; before any mutant runs, the
tool checks that both names import from the copy. No bytecode is written or read (a mutant and its restore
within one second, same size, would otherwise reuse a stale .pyc).

A mutant is *killed* when its tests fail, *survives* when they pass, is *stale* when its line is not in
the file (the code moved: update the mutant), and *timeout* when its tests ran past ``--timeout`` (counted as
killed). The score per module is killed / (killed + survived). Not part of CI: it runs the covering test
files once per mutant (minutes to an hour on two cores).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The test files that cover each module (run for every mutant of that module).
TESTS = {
    "kernels": ["tests/records/test_records_walk.py", "tests/kernels/test_kernels.py"],
    "models": ["tests/records/test_records_walk.py", "tests/engine/test_drafter_context.py",
               "tests/models/test_models.py"],
    "stages": ["tests/records/test_records_walk.py", "tests/engine/test_drafter_context.py",
               "tests/engine/test_oracles_sampling.py"],
    "sampling": ["tests/engine/test_oracles_sampling.py"],
    "records": ["tests/records/test_records_walk.py", "tests/records/test_recorded_settings.py",
                "tests/records/test_records.py"],
    "session": ["tests/records/test_recorded_settings.py", "tests/records/test_records_walk.py"],
    "serve.store": ["tests/serve/test_serve_isolation.py", "tests/records/test_recorded_settings.py"],
    "serve.app": ["tests/serve/test_serve_isolation.py", "tests/records/test_recorded_settings.py"],
    "payoff": ["tests/bench/test_payoff_summary.py"],
    "conform": ["tests/conform/test_causes.py", "tests/conform/test_diagnosis.py"],
}


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    # (old, new) alternatives: the first whose ``old`` occurs exactly once in the file is applied
    edits: tuple
    why: str
    tests: tuple = ()  # extra test files beside the module's

    @property
    def module(self) -> str:
        return self.id.rsplit(".", 1)[0]


def M(id_, file, old, new, why, alt=(), tests=()):
    return Mutant(id_, file, ((old, new), *alt), why, tuple(tests))


MUTANTS = [
    # ------------------------------------------------------------------ sampling (workbench/engine/sampling.py)
    M("sampling.top_p_untempered", "workbench/engine/sampling.py",
      "        keep = sp.cumsum(-1) - sp < s.top_p  # the smallest set whose mass reaches top_p",
      "        keep = (lambda u: u.cumsum(-1) - u < s.top_p)(torch.softmax(logits.float(), -1).gather(-1, order))",
      "top-p's set taken from the untempered probabilities"),
    M("sampling.top_p_boundary", "workbench/engine/sampling.py",
      "keep = sp.cumsum(-1) - sp < s.top_p", "keep = sp.cumsum(-1) < s.top_p",
      "top-p drops the token that reaches the mass"),
    M("sampling.top_k_drops_kth", "workbench/engine/sampling.py",
      'scores = scores.masked_fill(scores < kth, float("-inf"))', 'scores = scores.masked_fill(scores <= kth, float("-inf"))',
      "top-k keeps k - 1 tokens"),
    M("sampling.temperature_inverted", "workbench/engine/sampling.py",
      "scores = scores / s.temperature", "scores = scores * s.temperature", "temperature multiplies"),
    M("sampling.top_p_before_top_k", "workbench/engine/sampling.py",
      "    if 0 < s.top_k < scores.shape[-1]:", "    if 0 < s.top_k < scores.shape[-1] and s.top_p == 1:",
      "top-k ignored whenever top-p is set"),
    M("sampling.no_renormalise", "workbench/engine/sampling.py",
      "        probs = probs / probs.sum(-1, keepdim=True)", "        probs = probs",
      "top-p's kept mass not renormalised (samples alike, recorded probabilities wrong)"),
    M("sampling.choice_prob_max", "workbench/engine/sampling.py",
      "    return choice, probs.gather(-1, choice[..., None])[..., 0]", "    return choice, probs.max(-1).values",
      "the recorded probability is the mode's, not the draw's"),
    M("sampling.greedy_prob_unnormalised", "workbench/engine/sampling.py",
      "return choice, torch.exp(chosen - torch.logsumexp(logits.float(), dim=-1))", "return choice, torch.exp(chosen)",
      "greedy choice probability without the log-sum-exp"),
    # ------------------------------------------------------------------ records (workbench/records/cycle.py)
    M("records.accepted_off_by_one", "workbench/records/cycle.py",
      "        return int(self.accepted_nodes.shape[0]) - 1", "        return int(self.accepted_nodes.shape[0])",
      "the accepted length counts the root"),
    M("records.accept_length_no_bonus", "workbench/records/cycle.py",
      "        return self.accepted + 1", "        return self.accepted", "tau without the bonus"),
    M("records.meta_keeps_last_value", "workbench/records/cycle.py",
      "                self.meta[key] = [*seen, v]", "                self.meta[key] = v",
      "a changed setting's header entry claims its last value"),
    M("records.tau_denominator", "workbench/records/cycle.py",
      "        return sum(a) / len(a) if a else 0.0\n\n    def stage_seconds",
      "        return sum(a) / (len(a) + 1) if a else 0.0\n\n    def stage_seconds", "tau over one cycle too many"),
    M("records.v1_defaults_ignored", "workbench/records/cycle.py",
      '        defaults = {k: meta[k] for k in ("top_p", "top_k") if k in meta} if version == 1 else {}',
      "        defaults = {}", "version 1 traces lose their sampling settings"),
    M("records.draft_prob_unconditional", "workbench/records/cycle.py",
      "        return torch.exp(self.score - parent_score)", "        return torch.exp(self.score)",
      "a node's draft probability is its path's"),
    M("records.problem_bonus_unchecked", "workbench/records/cycle.py",
      "    if c.bonus != choice[last]:", "    if c.bonus != choice[last] and last == 0:",
      "a loaded trace's bonus checked only at the root"),
    # ------------------------------------------------------------------ session (workbench/engine/session.py)
    M("session.seed_not_in_meta", "workbench/engine/request.py",
      '"seed": seed, ', "", "the seed dropped from the trace's meta"),
    M("session.cycle_records_first_top_p", "workbench/engine/request.py",
      "parts, self.record_topk, self.sampling)",
      'parts, self.record_topk, Sampling(self.sampling.temperature, self.trace.meta["top_p"], self.sampling.top_k))',
      "a cycle records the session's first top_p, not the one it ran with"),
    M("session.record_topk_ignored", "workbench/records/build.py",
      "    k = record_topk\n", "    k = 8\n", "record_topk not applied"),
    # ------------------------------------------------------------------ stages (workbench/engine/stages/)
    M("stages.context_loses_previous_bonus", "workbench/engine/stages/commit.py",
      "ctx = features[b : b + 1, x] if features is not None else None",
      "ctx = features[b : b + 1, x[1:]] if features is not None else None",
      "the drafter's context loses the previous bonus token (the root's features)"),
    M("stages.commit_tokens_shifted", "workbench/engine/stages/commit.py",
      "out.append(Committed(x, h[3 : L + 3] + [bonus], bonus, ctx))",
      "out.append(Committed(x, h[2 : L + 2] + [bonus], bonus, ctx))", "committed tokens start at the root"),
    M("stages.tree_check_parent_order", "workbench/engine/stages/tree_check.py",
      "    bad = (par < lo) | (par > hi)  # [g, n]", "    bad = par < lo  # [g, n]",
      "a parent after its child passes the tree check", tests=("tests/engine/test_tree_check.py",)),
    M("stages.draft_slots_shifted", "workbench/engine/stages/draft.py",
      "return [Draft(torch.log_softmax(logits[:, : depths[0]].float(), dim=-1), rec,",
      "return [Draft(torch.log_softmax(logits[:, 1 : depths[0] + 1].float(), dim=-1), rec,",
      "a single row's drafted slots one off"),
    M("stages.verify_first_rows_sampling", "workbench/engine/stages/verify.py",
      "c, p = target_choice(out.logits[b : b + 1, :n], s, g)", "c, p = target_choice(out.logits[b : b + 1, :n], samplings[0], g)",
      "every batch row samples with the first row's settings", tests=("tests/engine/test_batch.py",)),
    M("stages.ddtree_budget_minus_one", "workbench/engine/policies/ddtree.py",
      "return build_tree_from_topk(*drafted.top(k), roots, self.budget)",
      "return build_tree_from_topk(*drafted.top(k), roots, self.budget - 1)",
      "DDTree builds one node fewer than its budget"),
    # ------------------------------------------------------------------ the model states (workbench/models/)
    M("models.commit_reversed", "workbench/models/dense_target.py",
      "        self.cache.keep_rows(layout.starts, nodes)", "        self.cache.keep_rows(layout.starts, [x.flip(0) for x in nodes])",
      "the accepted nodes' K/V rows kept in reverse order"),
    M("models.context_order", "workbench/models/drafter.py",
      "self.context = [c if f is None else torch.cat([c, f], dim=1) for c, f in zip(self.context, features)]",
      "self.context = [c if f is None else torch.cat([f, c], dim=1) for c, f in zip(self.context, features)]",
      "new drafter context put before the pending one"),
    M("models.draft_positions_shifted", "workbench/models/drafter.py",
      "positions = torch.arange(starts[0] - ctx.shape[1], starts[0] + Bk, device=dev)[None]",
      "positions = torch.arange(starts[0] - ctx.shape[1] + 1, starts[0] + Bk + 1, device=dev)[None]",
      "a single row's drafter positions one ahead"),
    M("models.draft_cache_keeps_block", "workbench/models/drafter.py",
      "        self.cache.set_lengths(starts)\n        self.context = [c[:, :0] for c in self.context]",
      "        self.cache.set_lengths([s + 1 for s in starts])\n        self.context = [c[:, :0] for c in self.context]",
      "the drafter keeps its block root's K/V"),
    M("models.batched_keep_rows_last", "workbench/models/kv_buffers.py",
      "src = torch.stack([s + x[j.clamp(max=x.shape[0] - 1)] for s, x in zip(starts, nodes)])  # [B, A]",
      "src = torch.stack([s + x.flip(0)[j.clamp(max=x.shape[0] - 1)] for s, x in zip(starts, nodes)])  # [B, A]",
      "batched commit keeps each row's path reversed", tests=("tests/engine/test_batch.py",)),
    # ------------------------------------------------------------------ kernels (kernels/, ddtree_kernels)
    M("kernels.kv_compact_reversed", "kernels/kv_compact.py",
      "    buf[:, :, start : start + rows.shape[0]] = buf.index_select(2, rows)",
      "    buf[:, :, start : start + rows.shape[0]] = buf.index_select(2, rows.flip(0))",
      "in-place compaction writes the path reversed"),
    M("kernels.kv_compact_offset", "kernels/kv_compact.py",
      "    rows = accepted.to(kv.device) + start\n", "    rows = accepted.to(kv.device) + start - 1\n",
      "compaction reads one row early"),
    M("kernels.accept_length_off_by_one", "kernels/accept.py",
      "    length = on_path.sum(-1) - 1", "    length = (on_path.sum(-1) - 1).clamp(max=max_depth - 1)",
      "the accept walk's length capped one short of the deepest node"),
    M("kernels.accept_root_not_agreed", "kernels/accept.py",
      "    agreed[:, 0] = True", "    agreed[:, 0] = tokens[:, 0] == choice[:, 0]", "the root must match its own choice"),
    M("kernels.compile_positions", "kernels/tree_compile.py",
      "    positions = tree.depth + (start if isinstance(start, int) else start.reshape(-1, 1))",
      "    positions = tree.parents.clamp(min=0) + (start if isinstance(start, int) else start.reshape(-1, 1))",
      "positions from the parent's index instead of the depth"),
    M("kernels.greedy_tie_fallback_removed", "kernels/greedy.py",
      "    if bool((v[..., 0] == v[..., 1]).any()):", "    if False:",
      "ties read off topk's order (equal logits)"),
    # ------------------------------------------------------------------ the served store (workbench/serve/store.py)
    M("serve.store.expire_busy", "workbench/serve/store.py",
      "old = [e for e in self._entries.values() if not e.busy and now - e.last_used > ttl]",
      "old = [e for e in self._entries.values() if now - e.last_used > ttl]", "a busy session may expire"),
    M("serve.store.capture_for_all", "workbench/serve/store.py",
      "            s.capture = ShapeCapture(s)", "            for x in self.entries(): x.session.capture = ShapeCapture(x.session)",
      "capture turned on for every live session"),
    M("serve.store.create_shares_seed", "workbench/serve/store.py",
      "s = self.engine.session(prompt, policy=policy, capture=cap, **kw)",
      "s = self.engine.session(prompt, policy=policy, capture=cap, **{**kw, 'seed': len(self._entries)})",
      "a served session seeded by the store, not its request", tests=("tests/serve/test_serve_batching.py",)),
    # ------------------------------------------------------------------ the served app (workbench/serve/app.py, replies.py)
    M("serve.app.patch_temperature_everywhere", "workbench/serve/app.py",
      "                s.temperature = req.temperature",
      "                [setattr(x.session, 'temperature', req.temperature) for x in store.entries()]",
      "a PATCH of one session's temperature applied to every live session",
      alt=(("                    setattr(s, name, v)  # the session's own checks and messages, and its trace's record",
            "                    [setattr(x.session, name, v) for x in store.entries()] if name == 'temperature' else "
            "setattr(s, name, v)"),)),
    M("serve.app.patch_policy_everywhere", "workbench/serve/app.py",
      "                s.policy = _policy(req.policy, store)",
      "                [setattr(x.session, 'policy', _policy(req.policy, store)) for x in store.entries()]",
      "a PATCH of one session's policy applied to every live session"),
    M("serve.app.state_record_topk", "workbench/serve/replies.py",
      '"record_topk": s.record_topk,', '"record_topk": 8,', "the state reports the default record_topk"),
    M("serve.app.state_top_k", "workbench/serve/replies.py",
      '"top_k": s.sampling.top_k,', '"top_k": 0,', "the state reports top_k as 0"),
    # ------------------------------------------------------------------ the pays-off verdict (workbench/payoff/verdict.py)
    M("payoff.decides_without_separation", "workbench/payoff/verdict.py",
      "        if not separated:", "        if False:", "what decides printed under a result that is not separated"),
    M("payoff.verify_width_from_noise", "workbench/payoff/verdict.py",
      "abs(widths[1] - widths[0]) >= NO_WIDTH", "True", "verify width named between verifies of one width"),
    # ------------------------------------------------------------------ conform (the differential diagnosis)
    M("conform.partial_match_named", "workbench/conform/diagnosis.py",
      "self.tried > 0 and self.matched == self.tried", "self.matched > 0", "a cause named on a partial match"),
    M("conform.same_step_downstream_blocks", "workbench/conform/diagnosis.py",
      '(f["step"], f["row"], order[u]) < at', '(f["step"], f["row"]) <= at[:2]',
      "a contract broken later in the same step keeps its input's candidates from being tried"),
    M("conform.mask_leaks_forward", "workbench/conform/suspects.py",
      "prev[torch.arange(1, n), torch.arange(0, n - 1)] = True", "prev[torch.arange(0, n - 1), torch.arange(1, n)] = True",
      "the suspected mask has each node see the next one, not the one before"),
    M("conform.outputs_after_the_fault", "workbench/conform/suspects.py",
      "    if not sample.clean or sample.ctx is None", "    if sample.ctx is None",
      "outputs compared on cycles whose committed state already carries the fault"),
]


# ------------------------------------------------------------------------------------------ the work copy
IGNORE = shutil.ignore_patterns(".venv", ".git", "__pycache__", ".pytest_cache", "*.pyc", "*.egg-info", ".ipynb_checkpoints",
                                "build", "dist")


def prepare(work: Path, base: str | None = None) -> dict:
    """A fresh copy of the repository at ``work`` (the working tree, or with ``base`` the commit ``base`` plus
    the untracked files git does not ignore); -> the environment that imports it."""
    if work.resolve() == ROOT:
        raise SystemExit("--work must not be this checkout")
    if work.exists():
        if any(work.iterdir()) and not (work / ".mutant_path").is_dir():
            raise SystemExit(f"{work} exists and is not a work copy of this tool; give another --work")
        shutil.rmtree(work)
    if base is None:
        shutil.copytree(ROOT, work, ignore=IGNORE, symlinks=True)
    else:
        work.mkdir(parents=True)
        tar = subprocess.run(["git", "archive", base], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=tar, check=True)
        new = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
        for rel in filter(None, new):
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, work / rel)
    shim = work / ".mutant_path"
    shim.mkdir()
    (shim / "ddtree_kernels").symlink_to(work / "kernels", target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(shim)]), "PYTHONDONTWRITEBYTECODE": "1",
           "MUTANTS_WORK": str(work)}
    probe = ("import workbench, ddtree_kernels, sys; import ddtree_kernels.accept; "
             "print(workbench.__file__); print(ddtree_kernels.__file__); print(sys.modules['ddtree_kernels.accept'].__file__)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=work, env=env, capture_output=True, text=True, check=True)
    for line in out.stdout.split():
        if not Path(line).resolve().is_relative_to(work.resolve()):
            raise SystemExit(f"the copy is not what gets imported: {line} (from {out.stdout.split()})")
    return env


class Planted:
    """Plant one mutant in the copy; restore the file's exact bytes on exit, whatever happened."""

    def __init__(self, work: Path, m: Mutant):
        self.path, self.m = work / m.file, m
        self.original: bytes | None = None

    def __enter__(self) -> bool:
        """-> False when the mutant is stale (no edit's ``old`` is in the file exactly once)."""
        self.original = self.path.read_bytes()
        text = self.original.decode("utf-8")
        for old, new in self.m.edits:
            if text.count(old) == 1:
                self.path.write_bytes(text.replace(old, new).encode("utf-8"))
                return True
        return False

    def __exit__(self, *exc):
        if self.original is not None:
            self.path.write_bytes(self.original)
            if self.path.read_bytes() != self.original:
                raise RuntimeError(f"could not restore {self.path}")
        return False


def run_tests(work: Path, env: dict, tests: list[str], timeout: float) -> tuple[str, float, str]:
    """-> (killed | survived | timeout | error, seconds, last lines)."""
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests]
    try:
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - t0, ""
    lines = (p.stdout + p.stderr).strip().splitlines()
    first_e = [x for x in lines if x.startswith("E ")][:1]
    tail = "\n".join([x for x in lines if x.startswith(("FAILED", "ERROR"))][:2] + [x[:200] for x in first_e] + lines[-1:])
    status = {0: "survived", 1: "killed"}.get(p.returncode, "error")
    return status, time.monotonic() - t0, tail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-v", "--verbose", action="store_true", help="print the failing test of each killed mutant")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("-k", default="", help="only mutants whose id contains this")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mutants-work"), help="where the copy lives")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per mutant's test run")
    ap.add_argument("--base", default=None, help="copy this commit (plus untracked files) instead of the working "
                    "tree, e.g. HEAD while other edits are in progress")
    ap.add_argument("--tests", default="", help="comma-separated test files to run instead of each module's")
    ap.add_argument("--no-baseline", action="store_true", help="skip running each test set unmutated first")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if args.k in m.id and (not args.only or m.id in args.only.split(","))]
    if args.list:
        for m in chosen:
            print(f"{m.id:45s} {m.file:40s} {m.why}")
        return 0
    if not chosen:
        print("no mutant matches")
        return 1

    def on_term(signum, frame):  # SIGTERM: unwind through the finally blocks (the file is restored)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    work = args.work.resolve()
    env = prepare(work, args.base)
    print(f"work copy: {work} (imports checked: workbench and ddtree_kernels come from it)", flush=True)
    test_sets = {m.id: args.tests.split(",") if args.tests else sorted(set(TESTS[m.module]) | set(m.tests))
                 for m in chosen}
    if not args.no_baseline:
        for tests in sorted({tuple(t) for t in test_sets.values()}):
            status, secs, tail = run_tests(work, env, list(tests), args.timeout)
            print(f"baseline {' '.join(tests)}: {'pass' if status == 'survived' else status} ({secs:.0f} s)", flush=True)
            if status != "survived":
                print(tail)
                print("the unmutated tests do not pass: fix that first (kills would mean nothing)")
                return 2
    results = []
    try:
        for m in chosen:
            with Planted(work, m) as planted:
                if not planted:
                    results.append((m, "stale", 0.0, ""))
                    print(f"{m.id:45s} stale (its line is not in {m.file}; update the mutant)", flush=True)
                    continue
                status, secs, tail = run_tests(work, env, test_sets[m.id], args.timeout)
            results.append((m, status, secs, tail))
            print(f"{m.id:45s} {status:8s} {secs:6.0f} s  {m.why}", flush=True)
            if status == "killed" and args.verbose:
                print("    " + tail.replace("\n", "\n    "), flush=True)
    except KeyboardInterrupt:
        print("interrupted: every planted file was restored", flush=True)
    finally:
        # Every file of the copy equals this checkout's again (the work copy itself may stay for reuse).
        for m in chosen:
            src, dst = ROOT / m.file, work / m.file
            if args.base is None and dst.exists() and src.exists() and dst.read_bytes() != src.read_bytes():
                print(f"note: {m.file} differs from the checkout (changed there during the run?)")
    modules: dict = {}
    for m, status, _, _ in results:
        modules.setdefault(m.module, []).append(status)
    print("\nscore per module (killed / (killed + survived); timeouts count as killed):")
    for mod, sts in modules.items():
        k = sum(s in ("killed", "timeout") for s in sts)
        sv = sum(s == "survived" for s in sts)
        extra = ", ".join(f"{sum(s == x for s in sts)} {x}" for x in ("stale", "error") if x in sts)
        print(f"  {mod:12s} {k}/{k + sv}" + (f" ({100 * k / (k + sv):.0f}%)" if k + sv else "") +
              (f"; {extra}" if extra else ""))
    survivors = [m for m, s, _, _ in results if s == "survived"]
    if survivors:
        print("survivors:\n" + "\n".join(f"  {m.id}: {m.why}" for m in survivors))
    k = sum(s in ("killed", "timeout") for _, s, _, _ in results)
    sv = len(survivors)
    print(f"total: {k}/{k + sv} killed" + (f" ({100 * k / (k + sv):.0f}%)" if k + sv else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
