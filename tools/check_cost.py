"""What checking a dump costs per cycle (``wb.conform``): measured on the embedded pairs here, and estimated for a
full-size pair on a GPU by the cost model (``workbench.shapes.conform_cost``).

    nice .venv/bin/python tools/check_cost.py [--tokens 48] [--repeats 3] [--threads 1]
    .venv/bin/python tools/check_cost.py --estimate-only [--gpu H200] [--contexts 1024,8192]

Measured: for each pair (dense, hybrid), policy (DFlash, DDTree(16)) and batch (1: two prompts, one session each;
4: four prompts in one batch session), a dump of the evaluation prompts (none tuned on) is written once, then
checked ``--repeats`` times on the pair already loaded (so loading is left out); per cycle = the check's seconds
over its cycle records, with the records' mean context length. Two clocks: the process's CPU time (one torch
thread: what a cycle costs on a core of its own, whatever else the machine runs) and the wall time (on a machine
shared with other jobs, an upper bound); the fastest repeat of each. A clean run: no cycle pays the acceptance a
broken contract costs (``broken_extra`` in the estimate).

Estimated: the checker's forwards per cycle (the path oracle's and the reference drafter's) for Qwen3-8B with its
DFlash drafter and for the hybrid Qwen3.6-35B-A3B (no drafter config ships for it: its drafter block, small
beside the target's forwards, is left out), at each context, as roofline seconds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def measure(tokens: int, repeats: int, pairs=("dense", "hybrid"), policies=("dflash", "ddtree:16"),
            batches=(1, 4), threads: int = 1) -> list[dict]:
    import torch

    import workbench as wb
    from workbench.conform.dump import read_dump
    from workbench.engine.policies import parse_policy
    from workbench.shipped import eval_prompts

    prompts = [p["prompt"] for p in eval_prompts()][:4]
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for pair in pairs:
        engine = wb.load() if pair == "dense" else wb.load("hybrid")
        torch.set_num_threads(threads)  # after the load: loading a pair sets the engine's own thread count
        for policy in map(parse_policy, policies):
            for batch in batches:
                path = tmp / f"{pair}-{policy.kind}-{batch}.dump"
                if batch == 1:  # two one-request sessions in one dump is not a thing: two dumps, checked in turn
                    paths = [tmp / f"{path.stem}-{i}.dump" for i in range(2)]
                    for p, text in zip(paths, prompts[:2]):
                        engine.session(text, policy=policy, max_new_tokens=tokens, record_topk=16, dump=p).run()
                else:
                    paths = [path]
                    engine.batch_session(prompts, policy, max_new_tokens=tokens, record_topk=16, dump=path).run()
                contexts = [rec["context_len"] for p in paths for rec in read_dump(p)[1]
                            if rec.kind == "cycle" and "context_len" in rec]
                wall, cpu = [], []
                for _ in range(repeats):
                    t0, c0 = time.perf_counter(), time.process_time()
                    cycles = 0
                    for p in paths:
                        r = wb.conform(p, models=engine)
                        assert r.ok, str(r)  # a clean run: the figure is the cost of checking, nothing broken
                        cycles += r.cycles
                    wall.append((time.perf_counter() - t0) / cycles)
                    cpu.append((time.process_time() - c0) / cycles)
                rows.append({"pair": pair, "policy": str(policy), "batch": batch, "cycles": cycles,
                             "context": statistics.mean(contexts), "cpu_s": min(cpu), "wall_s": min(wall),
                             "threads": torch.get_num_threads()})
                print(f"{pair:6s} {str(policy):11s} batch {batch}: {cycles:3d} cycles, mean context "
                      f"{rows[-1]['context']:.0f} tokens: {1e3 * min(cpu):.0f} ms CPU, {1e3 * min(wall):.0f} ms wall "
                      "per cycle (fastest repeat)", flush=True)
    return rows


def estimate(gpu: str, contexts: list[int]) -> None:
    from workbench.shapes.conform_cost import conform_cycle_cost

    for target, draft in (("qwen3-8b", "qwen3-8b-dflash-b16"), ("qwen3.6-35b-a3b", None)):
        # a DDTree(16) at depth 7 with 10 leaves (the most 17 nodes at that depth hold): the path oracle runs a row
        # per leaf, so the bushiest tree of a typical depth (the embedded pair's median is depth 3, 11 leaves)
        for label, nodes, depth, leaves in (("DFlash (16 nodes, depth 15)", 16, 15, 1),
                                            ("DDTree(16) (17 nodes, depth 7, 10 leaves)", 17, 7, 10)):
            for L in contexts:
                c = conform_cycle_cost(target, draft, gpu=gpu, context=L, nodes=nodes, depth=depth, leaves=leaves)
                parts = ", ".join(f"{r['forward']} {1e3 * r['seconds']:.1f} ms" for r in c["rows"])
                print(f"{target} {label}, context {L}: {1e3 * c['seconds']:.0f} ms per cycle on {c['gpu']} "
                      f"({c['flops'] / 1e12:.1f} TFLOP, {c['bytes'] / 1e9:.1f} GB; {parts}); a broken cycle adds "
                      f"{1e3 * c['broken_extra']['seconds']:.0f} ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads while checking (the cost assets were measured with 1)")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--contexts", default="1024,8192", help="context lengths for the estimate, comma-separated")
    ap.add_argument("--estimate-only", action="store_true")
    ap.add_argument("--pairs", default="dense,hybrid")
    ap.add_argument("--policies", default="dflash,ddtree:16")
    ap.add_argument("--batches", default="1,4")
    a = ap.parse_args(argv)
    if not a.estimate_only:
        print(f"measured on this machine's CPU, {a.threads} thread(s), shared with other developers' jobs: upper "
              "bounds", flush=True)
        measure(a.tokens, a.repeats, a.pairs.split(","), a.policies.split(","),
                [int(b) for b in a.batches.split(",")], a.threads)
    estimate(a.gpu, [int(x) for x in a.contexts.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
