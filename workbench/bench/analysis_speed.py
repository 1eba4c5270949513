"""Benchmark of the analyses on a synthetic 2,000-cycle trace (no model needed).

    python -m workbench.bench.analysis_speed --cycles 2000 --budget 64 --threads 2

The synthetic drafter is calibrated by construction: each cycle's target continuation is
sampled from the drafter's own per-slot distributions, so the printed ECE should be near 0
(a check that the benchmark measures the real code path, not an empty one).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ddtree_kernels import build_tree
from workbench.records.cycle import Cycle, Trace


def synthetic_trace(cycles: int = 2000, budget: int = 64, depth: int = 15, vocab: int = 4096, record_topk: int = 64,
                    seed: int = 0, chunk: int = 100) -> Trace:
    """A DDTree(budget) trace whose target continuations are drawn from the drafter's per-slot law."""
    g = torch.Generator().manual_seed(seed)
    out: list[Cycle] = []
    start, root = 100, 1
    for lo in range(0, cycles, chunk):
        c = min(chunk, cycles - lo)
        lp = torch.log_softmax(torch.randn(c, depth, vocab, generator=g) * 2.5, dim=-1)  # [c, D, V]
        tree = build_tree(lp, torch.zeros(c, dtype=torch.long), budget)
        y = torch.multinomial(lp.exp().reshape(-1, vocab), 1, generator=g).reshape(c, depth)  # continuation
        agree = tree.tokens == y.gather(1, (tree.depth - 1).clamp(min=0))
        agree[:, 0] = True
        match = agree.clone()
        for _ in range(depth):
            match = agree & match.gather(1, tree.parents.clamp(min=0))
        top = torch.topk(lp, record_topk, dim=-1)
        n = tree.n
        eye = torch.eye(n, dtype=torch.bool)
        z = torch.zeros(n, dtype=torch.long)
        for b in range(c):
            nodes = match[b].nonzero()[:, 0]
            nodes = nodes[torch.argsort(tree.depth[b, nodes])]
            L = nodes.numel() - 1
            bonus = int(y[b, L]) if L < depth else int(torch.randint(vocab, (1,), generator=g))
            toks = tree.tokens[b].clone()
            toks[0] = root
            out.append(Cycle(
                index=len(out), policy=f"DDTree({budget})", start=start, root_token=root,
                draft_topk_tokens=top.indices[b], draft_topk_logprobs=top.values[b], tokens=toks,
                parents=tree.parents[b], depth=tree.depth[b], rank=tree.rank[b], score=tree.score[b],
                position_ids=start + tree.depth[b], visibility=eye, retrieve_next_token=z, retrieve_next_sibling=z,
                target_choice=z, target_prob=torch.ones(n), accepted_nodes=nodes, accepted_tokens=toks[nodes],
                bonus=bonus, committed=L + 1, stage_seconds={}, forwards=(),
            ))
            start, root = start + L + 1, bonus
    return Trace(meta={"policy": f"DDTree({budget})", "synthetic": True}, cycles=out)


def time_it(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    from workbench.analysis import budget_needed, calibration

    ap = argparse.ArgumentParser(prog="python -m workbench.bench.analysis_speed", description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    trace = synthetic_trace(a.cycles, a.budget, record_topk=a.budget, seed=a.seed)
    print(f"synthetic trace: {len(trace)} cycles, {trace.cycles[0].n_nodes} nodes each, tau {trace.tau:.2f} "
          f"(made in {time.perf_counter() - t0:.1f} s; {a.threads} threads)")
    jobs = {
        "calibration(path)": lambda: calibration(trace),
        "calibration(token)": lambda: calibration(trace, kind="token"),
        "budget_needed + curve": lambda: budget_needed(trace).curve(),
    }
    jobs["all three"] = lambda: [f() for f in list(jobs.values())]
    print(f"{'analysis':24s} {'median s':>9s} {'p90 s':>7s} {'max s':>7s}")
    for name, fn in jobs.items():
        ts = sorted(time_it(fn, a.repeats))
        p90 = ts[min(len(ts) - 1, int(0.9 * len(ts)))]
        print(f"{name:24s} {statistics.median(ts):9.3f} {p90:7.3f} {ts[-1]:7.3f}")
    cal, need = calibration(trace), budget_needed(trace)
    print(f"check: ECE {cal.ece:.4f} (calibrated by construction); predicted tau at {a.budget} "
          f"{need.tau_at(a.budget):.3f} vs recorded {trace.tau:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
