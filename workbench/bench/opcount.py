"""Aten ops per cycle: a deterministic proxy for kernel launches, the same count on a CPU and a GPU.

A ``TorchDispatchMode`` sees every aten op the engine (or the plain reference decoder,
``workbench.bench.plain_decoder``) dispatches. Two counts per cycle:

* ``ops``: every aten op dispatched (views and no-op conversions included);
* ``kernels``: the ops that compute something: not views (``OpOverload.is_view``) and not an
  out-of-place op that returned its own input (``.to`` to the same dtype, ``lift_fresh``...).
  On a GPU each is (at least) one kernel launch; a view costs no launch.

Counting slows the ops down, so it is its own pass, never inside a timed run
(``bench --reference`` runs it after the timed comparison; ``bench --count-ops`` alone).
"""
from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...`` -> ``c.ops``, ``c.kernels``, ``c.by_op`` (kernels per op name)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.kernels = 0
        self.by_op: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        name = func.overloadpacket.__name__
        returned_input = (not name.endswith("_") and isinstance(out, torch.Tensor)
                          and any(out is a for a in args))
        if not (func.is_view or returned_input):
            self.kernels += 1
            self.by_op[name] += 1
        return out


def call_ops(fn) -> int:
    """Aten ops one call of ``fn`` dispatches, gradients off (the forward sweep's per-point count: each a kernel
    launch on a GPU, a dispatch on a CPU)."""
    with torch.no_grad(), OpCounter() as c:
        fn()
    return c.ops


def engine_ops(engine, policy, prompts: list[str], max_new_tokens: int = 32, batch: int = 1) -> dict:
    """Ops per cycle of the engine's cycles (the prefill is not counted), per request: ``batch`` > 1 runs
    the prompts as one ``BatchSession`` of ``batch`` requests and divides by the rows."""
    ops = kernels = cycles = 0
    for p in prompts:
        if batch == 1:
            s = engine.session(p, policy=policy, max_new_tokens=max_new_tokens, record_topk=1)
            with OpCounter() as c:
                s.run()
            n = len(s.cycles)
        else:
            b = engine.batch_session([p] * batch, policy=policy, max_new_tokens=max_new_tokens, record_topk=1)
            with OpCounter() as c:
                b.run()
            n = sum(len(bc.requests) for bc in b.cycles)  # request-cycles: ops per request per cycle
        ops, kernels, cycles = ops + c.ops, kernels + c.kernels, cycles + n
    return {"ops": ops / cycles, "kernels": kernels / cycles, "cycles": cycles}


def reference_ops(models, budget: int, prompts: list[str], max_new_tokens: int = 32) -> dict:
    """Ops per cycle of ``workbench.bench.plain_decoder.reference_generate``: the whole generation counted, less a
    prefill-only run of the same prompt (it has no hook between its prefill and its cycles)."""
    from workbench.bench.plain_decoder import reference_generate

    ops = kernels = cycles = 0
    for p in prompts:
        with OpCounter() as c0:
            reference_generate(models, p, budget, 1)  # the prefill alone: no cycle runs
        with OpCounter() as c:
            run = reference_generate(models, p, budget, max_new_tokens)
        ops, kernels = ops + c.ops - c0.ops, kernels + c.kernels - c0.kernels
        cycles += len(run.accept_lengths)
    return {"ops": ops / cycles, "kernels": kernels / cycles, "cycles": cycles}


def count_ops(engine, prompts: list[str], budgets=(16, 32, 64), max_new_tokens: int = 32,
              batch: int | None = 2) -> dict:
    """Per DDTree budget: ops and kernels per cycle of the reference decoder, the engine alone, and (with
    ``batch``) the engine per request in a batch of ``batch`` copies of each prompt; ``ratio`` = engine /
    reference (<= 1: the engine dispatches no more than the plain decoder)."""
    from workbench.engine.policies import DDTree

    out = {}
    for budget in budgets:
        pol = DDTree(budget)
        row = {"reference": reference_ops(engine.models, budget, prompts, max_new_tokens),
               "engine": engine_ops(engine, pol, prompts, max_new_tokens)}
        if batch and batch > 1:
            row[f"engine_batch{batch}"] = engine_ops(engine, pol, prompts, max_new_tokens, batch)
        ref = row["reference"]
        row["ratio"] = {k: {m: v[m] / ref[m] for m in ("ops", "kernels")} for k, v in row.items() if k != "reference"}
        out[str(pol)] = row
    return out


def ops_table(res: dict) -> str:
    """One line per budget: ops | kernels per cycle for the reference and the engine (solo, per request in
    a batch), and engine / reference."""
    lines = ["aten ops per cycle (all ops | kernels = not views; a separate counting pass, untimed)"]
    for label, row in res.items():
        cells = [f"{k} {v['ops']:.0f} | {v['kernels']:.0f}" for k, v in row.items() if k != "ratio"]
        ratios = [f"{k} {r['ops']:.2f}x | {r['kernels']:.2f}x" for k, r in row["ratio"].items()]
        lines.append(f"  {label:<12} " + "   ".join(cells) + "   (engine / reference: " + ", ".join(ratios) + ")")
    return "\n".join(lines)
