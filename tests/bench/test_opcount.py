"""Aten ops per cycle (``workbench.bench.opcount``): the engine dispatches no more than the plain reference
decoder (``workbench.bench.plain_decoder``) on the same trees, solo and per request in a batch. Counts are
deterministic (same models, prompt and trees), so the comparison is exact, not a timing."""
from __future__ import annotations

import pytest
import torch

import workbench as wb
from workbench.bench.opcount import OpCounter, engine_ops, reference_ops


def test_counter_counts_kernels_not_views():
    x = torch.arange(6.0)
    with OpCounter() as c:
        y = x.view(2, 3)[0]  # views: ops, no kernels
        torch.tensor([1.0])  # lift_fresh returns its input: an op, no kernel
        (y + 1).sum()  # two kernels
    assert (c.ops, c.kernels) == (5, 2) and c.by_op == {"add": 1, "sum": 1}


@pytest.mark.parametrize("budget", [16, 64])
def test_engine_dispatches_no_more_ops_per_cycle_than_the_reference(engine, eval_prompts, budget):
    prompts = [eval_prompts[0]["prompt"]]
    ref = reference_ops(engine.models, budget, prompts, max_new_tokens=12)
    solo = engine_ops(engine, wb.DDTree(budget), prompts, max_new_tokens=12)
    batch = engine_ops(engine, wb.DDTree(budget), prompts, max_new_tokens=12, batch=2)
    assert ref["cycles"] == solo["cycles"] >= 2  # the same trees: as many cycles
    for what in ("ops", "kernels"):
        assert solo[what] <= ref[what], (what, solo, ref)
        assert batch[what] <= ref[what], (what, batch, ref)
