"""Shape capture (hooks live in workbench/shapes/hooks.py) and the capture-off overhead benchmark."""
from __future__ import annotations

import statistics
import time
import timeit

from workbench.shapes.hooks import ShapeCapture, capture, hooks_installed
from workbench.records.forward import ForwardMode

__all__ = ["ShapeCapture", "capture", "capture_overhead", "hooks_installed"]

def capture_overhead(engine=None, policy=None, prompt: str = "def parse(line):", cycles: int = 24,
                     repeats: int = 3) -> dict:
    """Capture-off overhead: median DDTree(64) cycle time with capture=None and with a capture on,
    and the exact cost of the capture-off branch in run_target/run_draft (timed in isolation).

    capture=None runs the same code as an engine without a capture argument except for the
    ``capture.forward(...) if capture else nullctx()`` / ``capture.take() if capture else ()``
    expressions, two per forward; ``off_overhead_pct`` is their cost per cycle over the median
    cycle time.
    """
    from workbench.engine.core import load
    from workbench.engine.policies import DDTree
    from workbench.models.run import nullctx

    engine = engine or load()
    policy = policy or DDTree(64)

    def median_cycle(cap_on: bool) -> float:
        s = engine.session(prompt, policy=policy, max_new_tokens=10_000)
        times = []
        for _ in range(cycles):
            if s.finished:
                break
            t0 = time.perf_counter()
            if cap_on:
                with capture(s):
                    s.step()
            else:
                s.step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    median_cycle(False)  # warm-up
    off, on = [], []
    for _ in range(repeats):  # interleaved so drift in machine load hits both alike
        off.append(median_cycle(False))
        on.append(median_cycle(True))
    capture_none = None

    def off_branch():
        with (capture_none.forward("target", ForwardMode.TARGET_VERIFY) if capture_none else nullctx()):
            pass
        return capture_none.take() if capture_none else ()

    n = 200_000
    per_forward = min(timeit.repeat(off_branch, number=n, repeat=5)) / n
    off_s, on_s = statistics.median(off), statistics.median(on)
    per_cycle = 2 * per_forward  # two forwards per drafted cycle (drafter block + target verify)
    return {"policy": str(policy), "cycle_ms_capture_none": 1e3 * off_s, "cycle_ms_capture_on": 1e3 * on_s,
            "off_branch_us_per_cycle": 1e6 * per_cycle, "off_overhead_pct": 100 * per_cycle / off_s,
            "on_overhead_pct": 100 * (on_s - off_s) / off_s,
            "hooks_after": hooks_installed(engine.models.target) + hooks_installed(engine.models.draft)}


