"""Will it fit: the bytes a run of ``rows`` x ``nodes`` after ``context`` holds (weights, K/V, the largest
forward's activations), from the cost model's per-family facts, against the device's free memory.

    need = needed_bytes(tcfg, dcfg, rows=8, nodes=64, context=512, dtype="bfloat16")   # {weights, kv, ...}
    check_fits(tcfg, dcfg, 8, 64, 512, "bfloat16", "cuda")        # before building weights: all of it
    check_fits_loaded(models, tcfg, dcfg, 8, 64, 512)             # weights already held: K/V + activations

The forward sweep (``workbench.bench.sweep``) and ``pays-off`` (``workbench.payoff``) refuse in one line what
would not fit before they allocate anything; both read the one estimate here, beside the cost model it reads.
"""
from __future__ import annotations

import torch

def free_bytes(device) -> int:
    """Memory a run may use: the GPU's free memory, or the host's available memory."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: line.split()[1] for line in f}
    return int(info["MemAvailable"]) * 1024


def needed_bytes(target_config: dict, draft_config: dict | None, rows: int, nodes: int, context: int,
                 dtype) -> dict:
    """Bytes a sweep of ``rows`` x ``nodes`` after ``context`` holds at its largest point: weights, K/V
    (target: context + nodes columns; drafter: context + its block) and the largest forward's activations
    (every node's logits, in the model dtype and float32 for the choice; the MLP's widest intermediate; the
    attention scores of a math-path SDPA), from the cost model's per-family facts."""
    from workbench.models.registry import dtype_bytes
    from workbench.shapes.cost import arch

    e = dtype_bytes(dtype)
    a = arch(target_config, "target")
    d = arch(draft_config, "draft") if draft_config is not None else None
    f = a.facts
    weights = (a.params + (d.params if d else 0)) * e
    kv = rows * a.kv_per_token * (context + nodes) * e
    block = d.draft["block_size"] if d else 0
    if d:
        kv += rows * d.kv_per_token * (context + 2 * block) * e
    n = max(nodes, 2 * block)
    H = f.hidden_size
    # the MLP's intermediate width per token (dense, or the routed experts' together): gate, up, product
    inter = max(max((L.mlp + L.topk * L.expert) // (3 * H) for L in f.layer_params), 4 * H)
    heads = f.attention.heads if f.attention else 1
    act = rows * n * (a.vocab * (e + 4) + 4 * inter * e) + rows * heads * n * (context + n) * 4
    return {"weights": int(weights), "kv": int(kv), "activations": int(act), "total": int(weights + kv + act)}


def check_fits(target_config: dict, draft_config: dict | None, rows: int, nodes: int, context: int, dtype,
               device, headroom: float = 0.9) -> dict:
    """Raise a one-line ValueError naming the config, the bytes needed and the fix when the sweep's
    model + K/V + activations would not fit in ``headroom`` of the device's free memory; else the bytes."""
    need = needed_bytes(target_config, draft_config, rows, nodes, context, dtype)
    free = free_bytes(device)
    if need["total"] > headroom * free:
        name = target_config.get("_name") or target_config.get("model_type")
        g = 2 ** 30
        raise ValueError(
            f"{name} in {str(dtype).replace('torch.', '')} at rows={rows}, nodes={nodes}, context={context} needs "
            f"{need['total'] / g:.1f} GiB (weights {need['weights'] / g:.1f}, K/V {need['kv'] / g:.2f}, activations "
            f"{need['activations'] / g:.2f}) but {torch.device(device)} has {free / g:.1f} GiB free: cut layers "
            f"(layers=, --layers), rows or nodes")
    return need


def check_fits_loaded(models, tcfg: dict, dcfg: dict, rows: int, nodes: int, context: int,
                      kv_rows: int | None = None) -> dict:
    """``check_fits`` for models already in memory: their weights are already held, so only K/V and
    activations must fit in what is free. ``kv_rows``: rows of K/V held at once (default ``rows``; a sweep
    holds one state per point)."""
    need = needed_bytes(tcfg, dcfg, rows, nodes, context, models.dtype)
    if kv_rows is not None:
        need["kv"] = needed_bytes(tcfg, dcfg, kv_rows, nodes, context, models.dtype)["kv"]
    free = free_bytes(models.device)
    extra = need["kv"] + need["activations"]
    if extra > 0.9 * free:
        g = 2 ** 30
        raise ValueError(f"{tcfg.get('_name')} at rows={rows}, nodes={nodes}, context={context} needs "
                         f"{extra / g:.2f} GiB of K/V and activations but {models.device} has {free / g:.1f} GiB "
                         f"free: fewer rows, nodes or a shorter context")
    return need
