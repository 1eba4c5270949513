"""Profile mode: where a cycle's time goes, op by op, inside the named stages.

``profile_generation`` runs one generation under the torch profiler. Every stage of every
cycle is a named range in the trace (see ``workbench.engine.stopwatch.Stopwatch``), so the trace
(Chrome trace JSON: open it in https://ui.perfetto.dev or chrome://tracing) shows draft,
tree_build, ... per cycle with the ops inside them.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch


def profile_generation(engine, policy, prompt: str, max_new_tokens: int, path, row_limit: int = 15) -> str:
    """Generate once under the profiler; write the trace to ``path`` (atomically). -> a table of the
    ops that took the most time, and of the stage ranges."""
    from workbench.bench.policy_bench import run_one

    path = Path(path)
    path.parent.mkdir(exist_ok=True)  # the folder's parent was checked to exist
    run_one(engine, policy, prompt, min(16, max_new_tokens))  # warm-up: keep one-time costs out
    acts = [torch.profiler.ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        run_one(engine, policy, prompt, max_new_tokens)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    key = "self_cuda_time_total" if engine.device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=row_limit)
