"""What checking a cycle costs, from configs (``workbench.shapes.conform_cost``): its FLOPs are FlopCounterMode's
count of the checker's own forwards on the embedded pair (the path oracle and the reference drafter), so the
estimate for a full-size pair prices the forwards the checker really runs."""
from __future__ import annotations

import pytest
import torch

from workbench.conform.check import chain_logits
from workbench.models.drafter_reference import Reference
from workbench.shapes.conform_cost import conform_cycle_cost

TARGET = "workbench/assets/target"
DRAFT = "workbench/assets/draft"


def _counter():
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_sdpa(q, k, v, *args, out_shape=None, **kwargs):  # the CUDA kernels' formula for the CPU one
        return sdpa_flop_count(q, k, v)

    return FlopCounterMode(display=False,
                           custom_mapping={torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa})


def test_the_estimate_counts_the_flops_of_the_checkers_own_forwards(engine):
    m = engine.models
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, 4000, (30,), generator=g).tolist()  # the committed context, the root last
    parents = [-1, 0, 0, 1, 1, 2, 3, 5, 7]  # 9 nodes, the deepest (node 8) at depth 4
    tokens = torch.randint(0, 4000, (len(parents),), generator=g).tolist()
    ref = Reference(m)
    with torch.inference_mode():
        with _counter() as fc:
            chain_logits(m.target, ctx[:-1], tokens, parents)
        oracle = fc.get_total_flops()
        with _counter() as fc:
            ref.draft_logits(ctx, m.block_size - 1)
        drafter = fc.get_total_flops()
    c = conform_cycle_cost(TARGET, DRAFT, context=len(ctx) - 1, nodes=len(parents), depth=4, dtype="float32",
                           leaves=3)  # nodes 4, 6 and 8
    rows = [r["flops"] for r in c["rows"]]
    assert rows[0] + rows[1] == oracle
    assert rows[2] + rows[3] == drafter
    assert c["flops"] == oracle + drafter and not c["hybrid"]
    assert c["broken_extra"]["seconds"] > 0


def test_a_longer_context_costs_more_and_a_hybrid_runs_every_path_on_its_whole_context():
    short, long = (conform_cycle_cost("qwen3-8b", "qwen3-8b-dflash-b16", context=L) for L in (1024, 8192))
    assert long["seconds"] > 4 * short["seconds"]
    hyb = conform_cycle_cost("qwen3.6-35b-a3b", context=1024, nodes=17, depth=8)
    assert hyb["hybrid"] and "9 paths, each with its whole context" in hyb["rows"][0]["forward"]
    assert hyb["rows"][0]["flops"] > 6 * hyb["rows"][1]["flops"]  # 9 rows of 1033 tokens against one of 1024


@pytest.mark.parametrize("kw, words", [(dict(depth=17, nodes=17), "depth=17 with nodes=17"),
                                       (dict(context=0), "context=0 must be a positive integer"),
                                       (dict(nodes=True), "nodes=True must be")])
def test_bad_shapes_are_one_line(kw, words):
    with pytest.raises(ValueError, match=words.replace("(", "\\(")):
        conform_cycle_cost("qwen3-8b", **kw)
