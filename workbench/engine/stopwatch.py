"""The stage stopwatch: where each second of a cycle went (``Cycle.stage_seconds``)."""
from __future__ import annotations

import time

import torch


def clock(device: torch.device) -> float:
    """Seconds, after the device's queued work is done (a CUDA kernel launch returns before it runs)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


class Stopwatch:
    """Times the consecutive stages of one cycle: ``start("draft")`` ... ``start("verify")`` ... ``stop()``.

    Each start closes the previous stage. While a torch profiler records, every stage is also a
    named range in its trace (``bench --profile``), so a slow cycle can be read stage by stage.
    The cycle starts it at each stage boundary itself (one clock read each) rather than through the hook
    points: every Cycle records its stage times, so a hook-borne stopwatch would put every cycle on the
    hooked path. Observers of a stage hang on the hook points (``workbench.engine.hooks``).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.times: dict[str, float] = {}
        self._name: str | None = None
        self._t = 0.0
        self._range = None
        self._profiling = torch.autograd._profiler_enabled()

    @property
    def stage(self) -> str | None:
        """The stage being timed now (None once stopped)."""
        return self._name

    def start(self, name: str) -> None:
        now = self.stop()
        self._name, self._t = name, now
        if self._profiling:
            self._range = torch.profiler.record_function(name)
            self._range.__enter__()

    def stop(self) -> float:
        now = clock(self.device)
        if self._name is not None:
            self.times[self._name] = self.times.get(self._name, 0.0) + now - self._t
            if self._range is not None:
                self._range.__exit__(None, None, None)
                self._range = None
            self._name = None
        return now
