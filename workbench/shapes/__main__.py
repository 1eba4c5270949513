"""``python -m workbench.shapes``: print a shape plan (--plan CONFIG) or run the capture benchmark (--bench)."""
from __future__ import annotations

from workbench.shapes import capture_overhead, plan

def _main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m workbench.shapes", description="Forward-mode shapes: plans and the capture benchmark")
    ap.add_argument("--bench", action="store_true", help="capture-off overhead benchmark")
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--cycles", type=int, default=24)
    ap.add_argument("--plan", default=None, help="a target config.json: print its shape plan")
    ap.add_argument("--draft-config", default=None)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    if a.budget < 1:  # bad input: one line and exit 2, like the workbench CLI
        ap.exit(2, f"{ap.prog}: error: --budget {a.budget} must be a positive integer\n")
    if a.plan:
        try:
            p = plan(a.plan, budget=a.budget, draft_config=a.draft_config)
        except ValueError as e:  # an unknown family, a missing field: one line, exit 2
            ap.exit(2, f"{ap.prog}: error: {e}\n")
        print(p)
        print(p.compare())
    if a.bench:
        from workbench.engine.core import load
        from workbench.engine.policies import DDTree

        eng = load(target=a.target, draft=a.draft, threads=a.threads)
        for k, v in capture_overhead(eng, DDTree(a.budget), cycles=a.cycles).items():
            print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    if not (a.plan or a.bench):
        ap.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
