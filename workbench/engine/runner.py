"""The one cycle implementation: B >= 1 requests stepped together, draft -> tree build -> compile ->
verify -> accept -> commit -> records.

``Rows`` holds the two model states (target and drafter, each one object for every row) and runs the
stages in order over whatever requests it is given; a ``Session`` is one row, a ``BatchSession`` many.
The requests (``workbench.engine.session.Session``) keep their own settings, outputs and traces; ``Rows`` keeps
no reference to them between calls.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from workbench.engine import stages
from workbench.records.forward import ForwardMode, ForwardRecord
from workbench.models.layout import TreeLayout
from workbench.models.registry import new_draft_state, new_target_state
from workbench.engine.sampling import target_choice
from workbench.records.build import CycleParts

_STAGE_HOOKS: list = []  # callables(name) run as each stage of any cycle starts (see stage_hook)


@contextmanager
def stage_hook(fn):
    """Within the block, ``fn(name)`` runs as each named stage of every cycle starts ("draft", "verify",
    ...; "other" first), before the stage's work: what a checker needs to watch one stage of a live
    cycle (``workbench.engine.graphs.readiness`` logs host reads from the draft to the verify forward)."""
    _STAGE_HOOKS.append(fn)
    try:
        yield fn
    finally:
        _STAGE_HOOKS.remove(fn)


def clock(device: torch.device) -> float:
    """Seconds, after the device's queued work is done (a CUDA kernel launch returns before it runs)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


class Stopwatch:
    """Times the consecutive stages of one cycle: ``start("draft")`` ... ``start("verify")`` ... ``stop()``.

    Each start closes the previous stage. While a torch profiler records, every stage is also a
    named range in its trace (``bench --profile``), so a slow cycle can be read stage by stage.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.times: dict[str, float] = {}
        self._name: str | None = None
        self._t = 0.0
        self._range = None
        self._profiling = torch.autograd._profiler_enabled()

    def start(self, name: str) -> None:
        for hook in _STAGE_HOOKS:
            hook(name)
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


def static_nodes(policy, block_size: int) -> int:
    """Nodes (root included) every verify of ``policy`` is padded to under static shapes: its largest tree."""
    return policy.static_nodes(block_size)


class SessionFinished(RuntimeError):
    """``step()`` was called on a session that has already ended."""


class Rows:
    """The model states of B >= 1 requests and the cycle over them.

    ``prefill(reqs)`` starts every request; ``step(reqs)`` runs one cycle for the requests given (the
    live ones, in row order) and returns (their Cycle records, the cycle's TreeLayout, the batched
    forwards' records, the stopwatch still running in "record" so the caller's bookkeeping is timed);
    ``select(rows)`` retires rows, ``admit(reqs)`` adds requests to running rows (prefilled apart, their
    rows appended), ``take(rows)`` copies rows out into a new ``Rows`` (for stepping a subset) and
    ``merge(other)`` appends another's rows. Row order is the caller's to track: the requests handed to
    ``step`` must be this object's rows, in order.

    What the cycle reads of a request and hands it (``workbench.engine.request.Request``): its settings
    (``policy``, ``sampling``, ``generator``, ``max_new_tokens``, ``kernel_backend``, ``capture``), its
    position (``start``, ``bonus``, ``generated``, ``prompt_ids``), and ``begin`` (after the prefill),
    ``extend`` (the committed tokens) and ``record`` (its share of the cycle) -- nothing else.
    """

    def __init__(self, models, static_shapes: bool = False, graphs=None):
        """``static_shapes``: every draft and verify forward of a fixed policy has the same shapes and
        storage (trees padded to the policy's node count, buffers preallocated to the requests' limit, no
        host read between the draft and the verify forward); ``graphs``: a ``workbench.engine.graphs.Graphs``
        that captures and replays those forwards (CUDA; implies static shapes)."""
        self.models = models
        self.target = new_target_state(models)
        self.draft = new_draft_state(models)
        self.prefill_record: ForwardRecord | None = None
        self.static_shapes = static_shapes or graphs is not None
        self.graphs = graphs
        self.capacity = 0
        if self.static_shapes:
            for st in (self.target, self.draft):
                if not st.supports_static_shapes:
                    raise ValueError(f"static_shapes=True: {type(st).__name__} runs with dynamic shapes only "
                                     "(it declares no static-shape path); drop static_shapes for this model")

    def _preallocate(self, reqs: list, nodes: int) -> None:
        """Buffers for the requests' whole limit (prompt + max_new_tokens + a tree or two draft blocks),
        rounded up to a length bucket of 256; a larger limit later moves to the next bucket."""
        m = self.models
        need = max(len(s.prompt_ids) + s.max_new_tokens for s in reqs) + max(nodes, 2 * m.block_size)
        if need <= self.capacity:
            return
        self.capacity = max(-(-need // 256) * 256, self.capacity)
        for st in (self.target, self.draft):
            st.preallocate(len(reqs), self.capacity)
            st.graphs = self.graphs

    def _capture(self, reqs: list) -> None:
        """A one-row batch records its forwards' module shapes while its session's capture is on
        (``wb.shapes.capture(s)`` sets it between cycles)."""
        self.target.capture = self.draft.capture = reqs[0].capture if len(reqs) == 1 else None

    def prefill(self, reqs: list) -> None:
        m = self.models
        t0 = clock(m.device)
        self._capture(reqs)
        if self.static_shapes:
            self._preallocate(reqs, max(static_nodes(s.policy, m.block_size) for s in reqs))
        out = self.target.prefill([s.prompt_ids for s in reqs])
        self.draft.start([out.features[b : b + 1, : len(s.prompt_ids)] for b, s in enumerate(reqs)])
        self.prefill_record = out.record
        top2 = out.logits[:, -1].topk(2)  # each first token's runner-up, for wb.first_divergence
        chosen = []
        for b, s in enumerate(reqs):
            choice, _ = target_choice(out.logits[b : b + 1], s.sampling, s.generator)
            chosen.append(int(choice[0, 0]))
        seconds = clock(m.device) - t0
        for b, (s, t) in enumerate(zip(reqs, chosen)):
            s.begin(t, out.record, seconds, {"tokens": top2.indices[b].tolist(),
                                             "logits": top2.values[b].float().tolist()})

    @property
    def rows(self) -> int:
        return self.target.rows

    def admit(self, reqs: list) -> None:
        """Start ``reqs`` and append their rows after the running ones: one prefill (EXTEND) over the new
        prompts alone, then their state joins these rows (dynamic shapes only)."""
        if not self.rows:  # every earlier row retired (or none yet): fresh states, as a new Rows has
            self.target, self.draft = new_target_state(self.models), new_draft_state(self.models)
            self.capacity = 0
            return self.prefill(reqs)
        if self.static_shapes:
            raise ValueError("admit: static shapes fix the rows of a forward; requests join running rows with "
                             "dynamic shapes only (drop static_shapes / cuda_graphs for a batching driver)")
        new = Rows(self.models)
        new.prefill(reqs)
        self.merge(new)
        self.prefill_record = new.prefill_record

    def row_bytes(self, row: int) -> int:
        """Bytes of committed model state (target and drafter) held for one row."""
        return sum(t.nelement() * t.element_size() for st in (self.target, self.draft)
                   for kv in st.view(row) for t in kv)

    def take(self, rows: list[int]) -> "Rows":
        """A new ``Rows`` holding copies of ``rows`` (in that order); these are unchanged."""
        out = Rows(self.models)
        out.target, out.draft = self.target.take(rows), self.draft.take(rows)
        return out

    def merge(self, other: "Rows") -> None:
        """Append ``other``'s rows after these (``other`` is consumed)."""
        self.target.admit(other.target)
        self.draft.admit(other.draft)

    def select(self, rows: list[int]) -> None:
        self.target.select(rows)
        self.draft.select(rows)

    def step(self, reqs: list) -> tuple[list, TreeLayout, tuple, Stopwatch]:
        m = self.models
        sw = Stopwatch(m.device)
        sw.start("other")  # checks and bookkeeping between the named stages
        self._capture(reqs)
        starts, roots, policies = [s.start for s in reqs], [s.bonus for s in reqs], [s.policy for s in reqs]
        # Never draft past a request's token limit or the model's positions.
        depths = [min(m.block_size - 1, s.max_new_tokens - len(s.generated) - 1, m.max_positions - 1 - s.start)
                  for s in reqs]
        uses = [p.drafts and d > 0 for p, d in zip(policies, depths)]
        max_depths = [d if u else 0 for d, u in zip(depths, uses)]  # a root-only tree needs no ancestry work

        nodes = None
        if self.static_shapes:  # one node count per policy mix: the forwards' shapes do not change
            nodes = max(static_nodes(p, m.block_size) for p in policies)
            self._preallocate(reqs, nodes)

        sw.start("draft")
        drafted = [None] * len(reqs)
        if any(uses):
            drafted = stages.draft(self.draft, roots, starts, [d if u else None for d, u in zip(depths, uses)])
        sw.start("tree_build")
        trees = [stages.tree_build(p, d, r, m.device, sync_free=self.static_shapes)
                 for p, d, r in zip(policies, drafted, roots)]
        sw.start("tree_compile")
        layout = stages.tree_compile(trees, starts, max_depths, nodes)
        sw.start("verify")
        # A state that runs kernels inside its forward (a hybrid's GatedDeltaNet layers) takes the backend here.
        self.target.kernel_backend = reqs[0].kernel_backend
        mode = ForwardMode.DECODE if not any(p.drafts for p in policies) else ForwardMode.TARGET_VERIFY
        verified = stages.verify(self.target, layout, mode, [s.sampling for s in reqs],
                                 [s.generator for s in reqs], sync_free=self.static_shapes)
        sw.start("accept")
        accepted = stages.accept(reqs[0].kernel_backend, layout, verified)
        sw.start("commit")
        committed = stages.commit(self.target, layout, accepted, verified.features)
        self.draft.add_context([c.context for c in committed])
        kept = [s.extend(c.tokens) for s, c in zip(reqs, committed)]
        sw.start("record")
        times = sw.times  # every Cycle holds this dict: "record" and the rest of "other" land in it later
        cycles = []
        state_from = self.target.state_from  # [B, N]: recurrent targets only (None: no recurrent state)
        for b, s in enumerate(reqs):
            cycles.append(s.record(CycleParts(
                policies[b], starts[b], roots[b], drafted[b], layout.trees[b], layout.compileds[b],
                verified.row(b, layout.n[b]), committed[b], kept[b], times,
                None if state_from is None else state_from[b, : layout.n[b]])))
        draft_rec = next((d.record for d in drafted if d is not None), None)
        forwards = tuple(r for r in (draft_rec, verified.record) if r is not None)
        return cycles, layout, forwards, sw
