"""``python -m workbench kernels``: the tree kernels' micro-bench (``workbench.bench.kernel_bench``). It runs
kernels on random inputs, no engine, so it takes no ``--engine``."""
from __future__ import annotations

import argparse
import json

from workbench.cli_args.values import UsageError, device, positive_int, progress


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="micro-benchmarks of the tree kernels against their oracles")
    p.add_argument("--budgets", default=None,
                   help="comma-separated tree budgets, each 1 to 4096 (default 16,32,...,1024)")
    p.add_argument("--repeats", type=positive_int, default=10, help="timed calls per measurement (median)")
    p.add_argument("--device", type=device, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="progress on stderr (default: on; --no-progress or --quiet silences it)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def budgets_of(text: str | None) -> tuple[int, ...] | list[int]:
    """``--budgets`` -> the budgets (the default set when not given); one line on anything else."""
    from workbench.bench.kernel_bench import KERNEL_BUDGETS
    from workbench.engine.policies import MAX_BUDGET

    if not text:
        return KERNEL_BUDGETS
    try:
        budgets = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise UsageError(f"--budgets {text!r}: each budget must be a positive integer") from None
    if not budgets or min(budgets) < 1:
        raise UsageError(f"--budgets {text!r}: each budget must be a positive integer")
    twice = sorted({b for b in budgets if budgets.count(b) > 1})
    if twice:
        raise UsageError(f"--budgets {text!r}: budget {twice[0]} is given twice; give each budget once")
    if max(budgets) > MAX_BUDGET:
        raise UsageError(f"--budgets {text!r}: budget {max(budgets)} is absurdly large; "
                         f"the limit is {MAX_BUDGET} nodes, as for --policies")
    return budgets


def run(args, out, err) -> int:
    import torch

    from workbench.bench.kernel_bench import kernel_table, time_kernels

    budgets = budgets_of(args.budgets)
    if args.threads:
        torch.set_num_threads(args.threads)
    res = time_kernels(budgets, repeats=args.repeats, device=args.device, progress=progress(args))
    print(json.dumps(res) if args.json else kernel_table(res), file=out)
    return 0
