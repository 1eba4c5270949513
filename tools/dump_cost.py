"""What a cycle dump costs: the engine with dumping off and on, interleaved per prompt, and the file size.

    OMP_NUM_THREADS=1 .venv/bin/python tools/dump_cost.py [--prompts 12] [--tokens 64] [--policy ddtree:16]

Per prompt (the evaluation prompts, none tuned on): a session with dumping off, one with dumping on, then off
again, alternating so machine load hits both alike; cycles are identical (greedy). Reports per-cycle time
with dumping off and on (medians over prompts of the per-prompt mean), the paired on/off ratio with its
p10/p50/p90 and a Wilcoxon signed-rank p-value (scipy) and the dump's bytes per cycle. Dumping off adds nothing
to a cycle: the writer hangs on the request's hook points, and a request without hooks runs no hook code. The
time inside the writer is timed around its hooks (wrappers this tool installs), so it is measured apart from
the machine's noise. The copies the drafter's state makes of its forward's inputs for ``cycle.hook_draft_input``
are not inside it: they count in the cycle's time with dumping on.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--policy", default="ddtree:16")
    ap.add_argument("--batch", type=int, default=1, help="requests per batch session (1: engine.session)")
    a = ap.parse_args(argv)
    import workbench as wb
    from workbench.shipped import eval_prompts
    from workbench.engine.policies import parse_policy

    engine = wb.load()
    policy = parse_policy(a.policy)
    prompts = [p["prompt"] for p in eval_prompts()][: a.prompts * a.batch]
    tmp = Path(tempfile.mkdtemp())

    def run(i: int, dump: bool) -> tuple[float, int, int]:
        path = tmp / f"p{i}.dump" if dump else None
        again = dump and path.exists()  # the warm-up wrote p0.dump: this tool's own file, replaced on purpose
        if a.batch == 1:
            s = engine.session(prompts[i], policy=policy, max_new_tokens=a.tokens, dump=path, dump_replace=again)
            t0 = time.perf_counter()
            s.run()
            secs, cycles = time.perf_counter() - t0, len(s.trace.cycles)
        else:
            b = engine.batch_session(prompts[i * a.batch : (i + 1) * a.batch], policy=policy,
                                     max_new_tokens=a.tokens, dump=path, dump_replace=again)
            t0 = time.perf_counter()
            b.run()
            secs, cycles = time.perf_counter() - t0, sum(len(s.trace.cycles) for s in b.sessions)
        return secs, cycles, path.stat().st_size if dump else 0

    from workbench.conform.engine_dump import EngineDump

    spent = [0.0]  # seconds inside the writer (its hooks), timed around the calls

    def timed(fn):
        def wrapper(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[0] += time.perf_counter() - t
        return wrapper

    for name in ("on_begin", "on_draft_input", "on_committed", "on_record"):
        setattr(EngineDump, name, timed(getattr(EngineDump, name)))
    run(0, False), run(0, True)  # warm-up
    spent[0] = 0.0
    off, on, size, rows = [], [], [], []
    for i in range(a.prompts):
        t_off1, n, _ = run(i, False)
        t_on, n_on, b = run(i, True)
        t_off2, _, _ = run(i, False)
        assert n == n_on, "dumping changed the run"
        off.append((t_off1 + t_off2) / 2 / n)
        on.append(t_on / n)
        size.append(b / n)
        rows.append(n)

    ratio = np.array(on) / np.array(off)
    p = stats.wilcoxon(on, off).pvalue
    print(f"{a.policy}, {a.prompts} prompts x {a.tokens} new tokens, batch {a.batch}, {sum(rows)} cycle records, "
          f"CPU, {engine.models.dtype}, shared 2-core machine")
    print(f"  per cycle: dumping off {1e3 * statistics.median(off):.2f} ms, on {1e3 * statistics.median(on):.2f} ms "
          f"(medians over prompts)")
    print(f"  on / off per prompt: p10 {np.percentile(ratio, 10):.3f}  p50 {np.median(ratio):.3f}  "
          f"p90 {np.percentile(ratio, 90):.3f}   Wilcoxon p = {p:.2g}")
    print(f"  inside the writer: {1e3 * spent[0] / sum(rows):.3f} ms per cycle record (mean; the dump's whole "
          "cost, timed around its calls)")
    print(f"  dump size: {statistics.median(size) / 1024:.2f} KiB per cycle record (median; max "
          f"{max(size) / 1024:.2f})")
    print("  dumping off: no hook on the request, so the cycle runs no hook code and nothing of the writer")


if __name__ == "__main__":
    sys.exit(main())
