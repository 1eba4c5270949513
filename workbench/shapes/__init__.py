"""Forward-mode shapes: what every forward sees and returns, named the way SGLang names it, and
the tensors SGLang itself would build for the same forward.

    import workbench as wb
    s = engine.session("def f(x):", policy=wb.DDTree(32))
    with wb.shapes.capture(s):
        s.step()                                        # per-module shapes of this cycle
    wb.shapes.table(s, mode="TARGET_VERIFY", model="target")
    wb.shapes.table(s, mode="TARGET_VERIFY", view="sglang")   # SGLang's flat layout beside ours
    wb.shapes.compare({"AR": t_ar, "DFlash": t_df, "DDTree(32)": t_dd})   # rows aligned by module
    wb.shapes.check_contracts(s.trace)                  # pass/fail rows with the numbers
    p = wb.shapes.plan("workbench/configs/qwen3-8b.json", batch=8, prompt_len=512, budget=64,
                       draft_config="workbench/configs/qwen3-8b-dflash-b16.json")   # meta device, no weights
    p.compare(); p.sglang()                             # ours; SGLang's layout of every planned forward
    wb.shapes.plan("workbench/configs/deepseek-v3.json")   # Llama, Qwen3-MoE, MLA and hybrid targets too
    p.states, p.experts, p.facts                        # KV / latent / linear-attention states, experts touched
    wb.shapes.sglang_layout.custom_mask_elements([512] * 8, [16] * 8, "FULL_MASK")

Modules: ``capture`` (hooks, ``capture_overhead``), ``tables`` (ShapeTable, compare), ``forward_checks``
(check_contracts: a run's recorded forwards against the TARGET_VERIFY contracts), ``plan`` (meta-device plans),
``families`` (per-family facts from a config, the one home plan and cost share: config loading, layers, params,
KV / latent / linear-state bytes, experts), ``cost`` (FLOPs, bytes and roofline time per forward; ``machinery``: a tree's per-step machinery; ``parallel``:
its TP terms; ``measured``: its error against a measured sweep; ``parallel_table``: TP1/4/8 x nodes;
``memory_fit``: the bytes a run holds against the device's free memory), ``sglang_layout`` (SGLang's tensors per
mode), ``sglang_source`` (the SGLang rules mirrored, read from its installed source).
"""
from __future__ import annotations

from workbench.shapes import families, machinery, sglang_layout
from workbench.shapes.capture import ShapeCapture, capture, capture_overhead, hooks_installed
from workbench.shapes.cost import CostTable, Gpu, Speedup, cost, gpus as cost_gpus, speedup
from workbench.shapes.measured import SweepError, sweep_error
from workbench.shapes.parallel_table import ParallelTable, parallelism_table
from workbench.shapes.forward_checks import ancestor_matrix, check_contracts, target_record
from workbench.shapes.plan import CONFIGS, ShapePlan, plan
from workbench.shapes.sglang_layout import custom_mask_elements, layout, sglang_forward_modes
from workbench.shapes.tables import CheckTable, CompareTable, LayoutTable, ShapeTable, compare, fmt_bytes, table

__all__ = ["CheckTable", "CompareTable", "LayoutTable", "ShapeCapture", "ShapePlan", "ShapeTable",
           "capture", "capture_overhead", "check_contracts", "compare", "custom_mask_elements", "hooks_installed",
           "layout", "plan", "sglang_forward_modes", "sglang_layout", "table", "families"]

# The cost model (roofline cost, its error against a measured sweep, the TP table) and the shape helpers.
__all__ += ["CostTable", "Gpu", "Speedup", "cost", "cost_gpus", "speedup", "machinery"]
__all__ += ["SweepError", "sweep_error", "ParallelTable", "parallelism_table"]
__all__ += ["CONFIGS", "target_record", "ancestor_matrix", "fmt_bytes"]
