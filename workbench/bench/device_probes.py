"""The device's roofline as timed calls (matmul FLOP/s, streaming bandwidth, seconds per small op), which can
join a sweep's rounds so they see the load its points see; ``measure_device`` times them on their own."""
from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field

import torch

from workbench.bench.forward_timing import time_call


@dataclass
class Device:
    """The device's measured roofline (independent of the sweep's points): matmul FLOP/s, streaming
    bandwidth (a matrix-vector product over a matrix far larger than any cache) and the seconds one small
    op costs (dispatch on a CPU, launch on a GPU)."""

    name: str
    flops: float
    bandwidth: float
    op_seconds: float
    dtype: str
    threads: int
    flops_at: dict = field(default_factory=dict)  # {tokens (str): FLOP/s of a [tokens, H] x [H, 4H] matmul}

    def as_dict(self) -> dict:
        return asdict(self)


class Probes:
    """The device's roofline as timed calls that can join a sweep's rounds (so they see the load the points
    see): a [M, H] x [H, N] matmul per token count M (FLOP/s; N = max(4H, 2^22 / H), the peak at M = 2048 on
    a GPU, 256 on a CPU), a matrix-vector product over 2^27 (CPU) or 2^29 (GPU) elements (bytes/s: weights
    read once, as a memory-bound forward reads them) and a chain of 200 one-element adds (seconds per op)."""

    def __init__(self, device, dtype, hidden: int = 4096, tokens=()):
        dev = torch.device(device)
        dt = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))
        self.device, self.dtype, gpu = dev, dt, dev.type == "cuda"
        self.peak_m = 2048 if gpu else 256
        N = max(4 * hidden, 2 ** 22 // hidden)
        w = torch.randn(N, hidden, device=dev, dtype=dt)
        n = 2 ** (29 if gpu else 27)
        big = torch.empty(n // 8192, 8192, device=dev, dtype=dt).normal_()
        v = torch.randn(1, 8192, device=dev, dtype=dt)
        one = torch.zeros(1, device=dev, dtype=dt)

        def chain():
            for _ in range(200):
                one.add_(1)

        self.calls = []  # (name, fn, work: FLOPs, bytes or ops per call)
        for m in sorted({self.peak_m, *tokens}):
            x = torch.randn(m, hidden, device=dev, dtype=dt)
            self.calls.append((f"matmul {m}", (lambda x=x: x @ w.T), 2 * m * hidden * N))
        self.calls.append(("stream", lambda: v @ big.T, big.numel() * big.element_size()))
        self.calls.append(("op", chain, 200))
        self.samples = {name: [] for name, _, _ in self.calls}

    def run_once(self) -> None:
        for name, fn, _ in self.calls:
            self.samples[name].append(time_call(fn, self.device))

    def device_profile(self) -> Device:
        med = {name: statistics.median(self.samples[name]) for name, _, _ in self.calls}
        work = {name: w for name, _, w in self.calls}
        at = {name.split()[1]: work[name] / med[name] for name in med if name.startswith("matmul")}
        gpu = self.device.type == "cuda"
        name = torch.cuda.get_device_name(self.device) if gpu else f"CPU ({os.cpu_count()} cores)"
        return Device(name, at[str(self.peak_m)], work["stream"] / med["stream"], med["op"] / work["op"],
                      str(self.dtype).replace("torch.", ""), torch.get_num_threads(), at)


def measure_device(device, dtype, hidden: int = 4096, tokens=(), repeats: int = 5) -> Device:
    """``Probes`` timed on their own: one warm-up, then the median of ``repeats``."""
    p = Probes(device, dtype, hidden, tokens)
    with torch.no_grad():
        p.run_once()
        p.samples = {k: [] for k in p.samples}
        for _ in range(repeats):
            p.run_once()
    return p.device_profile()
