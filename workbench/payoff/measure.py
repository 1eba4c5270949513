"""Every shape its own decode, interleaved unit by unit, with target forwards and stage times counted from
the cycles (never inferred, never replayed from another shape's trace).

A unit is what one paired comparison compares: at batch 1 a prompt, at batch B a window of B prompts
(window i = prompts i, i+1, ..., i+B-1, wrapping), one ``engine.batch_session`` with one tree per row
verified in one forward. Within a repeat every shape runs on unit i before any runs on unit i+1, in an order
rotated per unit, so machine load hits every shape alike.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from workbench.engine.runner import clock


@dataclass
class UnitRun:
    """One decode of one unit with one shape: what the tables are made of."""

    tokens: int  # tokens the cycles committed, every row
    forwards: int  # target forwards, counted from the cycles' forward records
    row_cycles: int  # cycles summed over rows (each row's share of the forwards)
    accepted: int  # accept lengths (accepted + bonus) summed over the rows' cycles
    seconds: float  # time in the cycles (the stopwatch's stages add up to it)
    wall: float  # session start to the end, prefill included
    steps: list  # stage -> seconds, one dict per forward step, the first step (cold) left out
    outputs: list  # per row: the generated token ids
    nodes: int = 0  # nodes verified (root included), summed over the rows' cycles: the verify's width per row

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _target_forwards(records) -> int:
    return sum(1 for r in records if getattr(r, "model", None) == "target")


def decode_unit(engine, policy, prompts: list, max_new_tokens: int, temperature: float, seed: int,
                record_topk: int = 1):
    """Decode ``prompts`` (one: a session; several: one batch session) with ``policy`` -> (UnitRun, traces)."""
    t0 = clock(engine.device)
    if len(prompts) == 1:
        s = engine.session(prompts[0], policy=policy, temperature=temperature, seed=seed,
                           max_new_tokens=max_new_tokens, record_topk=record_topk)
        tr = s.run()
        wall = clock(engine.device) - t0
        steps = [dict(c.stage_seconds) for c in tr.cycles]
        forwards = sum(_target_forwards(c.forwards) for c in tr.cycles)
        traces, outputs = [tr], [list(s.generated)]
    else:
        b = engine.batch_session(prompts, policy=policy, temperature=temperature, seed=seed,
                                 max_new_tokens=max_new_tokens, record_topk=record_topk)
        b.run()
        wall = clock(engine.device) - t0
        steps = [dict(bc.stage_seconds) for bc in b.cycles]
        forwards = sum(_target_forwards(bc.forwards) for bc in b.cycles)
        traces, outputs = b.traces, [list(s.generated) for s in b.sessions]
    cycles = [c for t in traces for c in t.cycles]
    run = UnitRun(tokens=sum(c.committed for c in cycles), forwards=forwards, row_cycles=len(cycles),
                  accepted=sum(c.accept_length for c in cycles), seconds=sum(sum(s.values()) for s in steps),
                  wall=wall, steps=steps[1:], outputs=outputs, nodes=sum(c.n_nodes + 1 for c in cycles))
    return run, traces


def windows(n: int, batch: int) -> list[list[int]]:
    """Unit i at batch B: prompts i .. i+B-1 (wrapping); at batch 1 the prompts themselves."""
    return [[(i + j) % n for j in range(batch)] for i in range(n)]


@dataclass
class Sweep:
    """The runs of one batch size: runs[label][unit] = the UnitRuns of that unit (one per repeat)."""

    batch: int
    labels: list
    units: list  # prompt indices per unit
    runs: dict = field(default_factory=dict)
    mode = "static"  # every window runs until its slowest row ends (``workbench.payoff.refill``: the refilled one)

    def unit(self, label: str, i: int) -> UnitRun:
        """Unit i's run with its median time over repeats (counts are the first run's: greedy repeats)."""
        rs = self.runs[label][i]
        if len(rs) == 1:
            return rs[0]
        med = statistics.median(r.seconds for r in rs)
        first = rs[0]
        return UnitRun(first.tokens, first.forwards, first.row_cycles, first.accepted, med,
                       statistics.median(r.wall for r in rs), [s for r in rs for s in r.steps], first.outputs,
                       first.nodes)

    def steps(self, label: str) -> list:
        """Every unit's steps (stage -> seconds), each decode's first step left out."""
        return [st for i in range(len(self.units)) for st in self.unit(label, i).steps]

    def totals(self, label: str) -> tuple[int, int, int, int]:
        """(tokens, target forwards, row cycles, accept lengths) summed over the units."""
        us = [self.unit(label, i) for i in range(len(self.units))]
        return (sum(u.tokens for u in us), sum(u.forwards for u in us), sum(u.row_cycles for u in us),
                sum(u.accepted for u in us))


def run_sweep(engine, shapes, prompts: list[str], batch: int, max_new_tokens: int, temperature: float, seed: int,
              repeats: int, warmup: bool, bar) -> Sweep:
    """Every shape on every unit, interleaved (see the module docstring)."""
    units = windows(len(prompts), batch)
    labels = [s.label for s in shapes]
    sw = Sweep(batch, labels, units, {x: [[] for _ in units] for x in labels})
    if warmup:  # allocation and kernel selection are first-call costs: keep them out of the numbers
        for s in shapes:
            bar.set_postfix_str(f"batch {batch} warm-up {s.label}", refresh=False)
            decode_unit(engine, s.policy, [prompts[i] for i in units[0]], min(max_new_tokens, 16), temperature, seed)
            bar.update(1)
    for _ in range(repeats):
        for i, unit in enumerate(units):
            texts = [prompts[j] for j in unit]
            k = i % len(shapes)
            for s in shapes[k:] + shapes[:k]:  # rotated: no shape always runs first after a unit change
                bar.set_postfix_str(f"batch {batch} unit {i} {s.label}", refresh=False)
                run, _ = decode_unit(engine, s.policy, texts, max_new_tokens, temperature, seed)
                sw.runs[s.label][i].append(run)
                bar.update(1)
    return sw


def lossless_failures(sw, reference: str = "AR") -> list[str]:
    """Greedy shapes whose output differs from the reference's on a unit (a ``Sweep`` or the refilled one):
    one line each (first unit only)."""
    out = []
    for label in sw.labels:
        for i in range(len(sw.units)):
            if sw.unit(label, i).outputs != sw.unit(reference, i).outputs:
                mode = "" if sw.batch == 1 else f" ({sw.mode} batch)"
                out.append(f"{label} differs from {reference} on unit {i} at batch {sw.batch}{mode}")
                break
    return out
