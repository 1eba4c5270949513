"""The refilled batch: B slots served from a queue of prompts, as serving engines batch (SGLang and vLLM
refill a finished row's slot with the next waiting request at the next cycle), beside the static batch
(``workbench.payoff.measure``), where a window of B prompts runs until its slowest row ends.

One mechanism: the rows are one ``BatchSession``'s, and a slot is refilled by ``BatchSession.admit``, which
starts the new prompt exactly as the served engine's scheduler does (``Rows.admit``: one prefill over the new
prompts alone, their rows appended to the running ones). Every prompt is decoded once, in queue order; after
each cycle the finished rows leave and, before the next, the next prompts take their slots, so no more than
B rows are ever live.

What is paired: the prompt. Each prompt's figure is its committed tokens over its *share* of the cycle time
(each cycle's seconds split evenly over the rows it held), so the prompts' shares add up to the run's cycle
time and their figures split the queue's throughput (tokens over cycle time, the figure an engine reports)
without counting a cycle twice. The shapes run their queues side by side, one cycle each in turn (the order
rotated per round), so a slow spell of the machine hits every shape alike, as the static batch's interleaved
units do. Prefills (each prompt's one EXTEND) are timed apart and left out, as the static batch leaves its
prefill out.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from workbench.engine.runner import clock
from workbench.payoff.measure import UnitRun


@dataclass
class QueueRun:
    """One pass of the prompt queue with one shape: per prompt (queue order) and in all."""

    tokens: list  # per prompt: tokens its cycles committed
    shares: list  # per prompt: its share of the cycle time, seconds
    forward_shares: list  # per prompt: its share of the target forwards
    row_cycles: list  # per prompt: the cycles it ran in
    accepted: list  # per prompt: accept lengths (accepted + bonus) summed over its cycles
    outputs: list  # per prompt: the generated token ids
    joined: list  # per prompt: the index of the first cycle it ran in
    left: list  # per prompt: the index of the last cycle it ran in
    forwards: int  # target forwards, counted from the cycles' forward records
    seconds: float  # cycle time in all (the shares add up to it)
    prefill_seconds: float  # every admission's prefill, left out of ``seconds``
    live_rows: list  # rows per cycle
    steps: list  # stage -> seconds, one dict per cycle, the first (cold) left out
    nodes: list = field(default_factory=list)  # per prompt: nodes verified (root included) over its cycles

    def unit(self, i: int) -> UnitRun:
        """Prompt i as a paired unit: its tokens over its share of the cycle time."""
        return UnitRun(self.tokens[i], self.forward_shares[i], self.row_cycles[i], self.accepted[i], self.shares[i],
                       self.shares[i], [], [self.outputs[i]], self.nodes[i] if self.nodes else 0)


def target_forwards(records) -> int:
    return sum(1 for r in records if getattr(r, "model", None) == "target")


class RefilledQueue:
    """``prompts`` served by ``slots`` rows of one batch; ``step()`` refills free slots, then runs one cycle.
    ``max_new_tokens``: one limit, or one per prompt."""

    def __init__(self, engine, policy, prompts: list, slots: int, max_new_tokens, temperature: float, seed: int):
        self.engine, self.prompts, self.slots = engine, list(prompts), slots
        self.limits = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else \
            [max_new_tokens] * len(self.prompts)
        t0 = clock(engine.device)
        self.batch = engine.batch_session(self.prompts[:slots], policy=policy, temperature=temperature, seed=seed,
                                          max_new_tokens=self.limits[:slots], record_topk=1)
        self.prefill_seconds = clock(engine.device) - t0
        self.queued = min(slots, len(self.prompts))  # prompts started so far (queue order = request index)

    @property
    def finished(self) -> bool:
        return self.batch.finished and self.queued == len(self.prompts)

    def refill(self) -> None:
        """The next prompts into the free slots (a prompt its first token ends frees its slot at once)."""
        while self.queued < len(self.prompts) and len(self.batch.live) < self.slots:
            end = self.queued + self.slots - len(self.batch.live)
            new = self.prompts[self.queued : end]
            t0 = clock(self.engine.device)
            self.batch.admit(new, max_new_tokens=self.limits[self.queued : end])
            self.prefill_seconds += clock(self.engine.device) - t0
            self.queued += len(new)

    def step(self):
        """Refill, then one cycle of every live row -> the BatchCycle (None once the queue is done)."""
        self.refill()
        return None if self.batch.finished else self.batch.step()

    def run(self) -> QueueRun:
        while not self.finished:
            self.step()
        return self.result()

    def result(self) -> QueueRun:
        n, b = len(self.prompts), self.batch
        shares, fwd, joined, left = [0.0] * n, [0.0] * n, [None] * n, [None] * n
        for bc in b.cycles:
            seconds, rows = sum(bc.stage_seconds.values()), len(bc.requests)
            forwards = target_forwards(bc.forwards)
            for i in bc.requests:
                shares[i] += seconds / rows
                fwd[i] += forwards / rows
                joined[i] = bc.index if joined[i] is None else joined[i]
                left[i] = bc.index
        traces = b.traces
        return QueueRun(tokens=[sum(c.committed for c in t.cycles) for t in traces], shares=shares,
                        forward_shares=fwd, row_cycles=[len(t.cycles) for t in traces],
                        accepted=[sum(c.accept_length for c in t.cycles) for t in traces],
                        outputs=[list(s.generated) for s in b.sessions], joined=joined, left=left,
                        forwards=sum(target_forwards(bc.forwards) for bc in b.cycles),
                        seconds=sum(sum(bc.stage_seconds.values()) for bc in b.cycles),
                        prefill_seconds=self.prefill_seconds, live_rows=[len(bc.requests) for bc in b.cycles],
                        steps=[dict(bc.stage_seconds) for bc in b.cycles][1:],
                        nodes=[sum(c.n_nodes + 1 for c in t.cycles) for t in traces])


def run_side_by_side(queues: list, order_shift: int = 0) -> list[QueueRun]:
    """Step every queue one cycle in turn (the order rotated each round) until all are done."""
    k = order_shift
    while not all(q.finished for q in queues):
        turn = queues[k % len(queues):] + queues[: k % len(queues)]
        for q in turn:
            if not q.finished:
                q.step()
        k += 1
    return [q.result() for q in queues]


@dataclass
class RefilledSweep:
    """The refilled batch's runs at one batch size, read as the static sweep is read (``verdict.analyse``):
    units are the prompts; runs[label] = one QueueRun per repeat."""

    batch: int
    labels: list
    units: list  # [[prompt index]] per unit
    runs: dict = field(default_factory=dict)
    mode = "refilled"

    def unit(self, label: str, i: int) -> UnitRun:
        """Prompt i with its median share over repeats (counts are the first run's: greedy repeats)."""
        rs = [r.unit(i) for r in self.runs[label]]
        if len(rs) == 1:
            return rs[0]
        med = statistics.median(r.seconds for r in rs)
        return UnitRun(rs[0].tokens, rs[0].forwards, rs[0].row_cycles, rs[0].accepted, med, med, [], rs[0].outputs,
                       rs[0].nodes)

    def steps(self, label: str) -> list:
        return [st for r in self.runs[label] for st in r.steps]

    def totals(self, label: str) -> tuple[int, int, int, int]:
        """(tokens, target forwards counted from the records, row cycles, accept lengths) of the first run."""
        r = self.runs[label][0]
        return sum(r.tokens), r.forwards, sum(r.row_cycles), sum(r.accepted)

    def throughput(self, label: str) -> float:
        """The queue's tokens over its cycle time (median over repeats): what an engine reports."""
        return statistics.median(sum(r.tokens) / r.seconds if r.seconds > 0 else 0.0 for r in self.runs[label])

    def mean_rows(self, label: str) -> float:
        rows = self.runs[label][0].live_rows
        return sum(rows) / len(rows) if rows else 0.0


def run_refilled_sweep(engine, shapes, prompts: list[str], batch: int, max_new_tokens: int, temperature: float,
                       seed: int, repeats: int, warmup: bool, bar) -> RefilledSweep:
    """Every shape serves the whole queue with ``batch`` slots, the shapes side by side (see the module's
    docstring); ``repeats`` passes, each starting the rotation one shape later."""
    labels = [s.label for s in shapes]
    sw = RefilledSweep(batch, labels, [[i] for i in range(len(prompts))], {x: [] for x in labels})
    if warmup:  # the admission path's first-call costs too: one refill each
        bar.set_postfix_str(f"batch {batch} refilled warm-up", refresh=False)
        run_side_by_side([RefilledQueue(engine, s.policy, prompts[: batch + 1], batch, min(max_new_tokens, 16),
                                        temperature, seed) for s in shapes])
        bar.update(len(shapes))
    for r in range(repeats):
        bar.set_postfix_str(f"batch {batch} refilled, pass {r + 1}", refresh=False)
        queues = [RefilledQueue(engine, s.policy, prompts, batch, max_new_tokens, temperature, seed) for s in shapes]
        for s, run in zip(shapes, run_side_by_side(queues, order_shift=r)):
            sw.runs[s.label].append(run)
        bar.update(len(shapes))
    return sw
