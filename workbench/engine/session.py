"""A session: one generation stepped a cycle at a time, ``step()`` -> Cycle, ``run()`` -> Trace.

A ``Session`` is a request (``workbench.engine.request.Request``: settings, outputs, trace) with a driver
that steps it: ``Solo`` (its own one-row ``workbench.engine.runner.Rows``), its ``BatchSession``, or a
server's scheduler (``workbench.engine.scheduler``). A driver answers ``step_request(s)``, ``view(s)`` and
``cache_bytes(s)``; the session's API is the same whichever drives it.
"""
from __future__ import annotations

import os
import time
from typing import Protocol

import torch

from workbench.engine.hooks import as_pairs
from workbench.engine.policies import Policy
from workbench.engine.prompting import Prompt
from workbench.engine.request import DEFAULT_MAX_NEW_TOKENS, Request, SessionState  # noqa: F401  (re-exported)
from workbench.engine.runner import Rows, SessionFinished
from workbench.engine.sampling import Sampling
from workbench.records.build import to_host  # noqa: F401  (re-exported: workbench.engine.core.to_host)
from workbench.records.cycle import Cycle, Trace


class Driver(Protocol):
    """What steps a session and holds its model state."""

    def step_request(self, s: "Session") -> Cycle:
        """One cycle of ``s`` (others may run in the same forwards); refuses where ``s`` is not its to step."""

    def steps(self, s: "Session", more, each) -> None:
        """Cycles of ``s`` while it has not finished and ``more()`` holds, each handed to ``each(c, asked)``
        (``asked``: ``time.perf_counter()`` when the cycle was asked for) as it is made; ``step_each`` is
        the plain loop. A batching driver keeps ``s`` in its batch between them, so a run does not wait
        for its own thread to ask again (``workbench.engine.scheduler``)."""

    def view(self, s: "Session") -> list:
        """``s``'s committed model state per layer (``TargetState.view``), or [] when it holds none."""

    def cache_bytes(self, s: "Session") -> int:
        """Bytes of committed model state (target and drafter) held for ``s``."""

    def kv_shapes(self, s: "Session") -> list[list[list[int]]]:
        """The shapes of ``view(s)``'s tensors, per layer (as of ``s``'s last cycle; never waits for a forward)."""

    def release(self, s: "Session") -> None:
        """``s`` has ended early (``Session.close``): the model state held for it goes now, not at the end of
        the driver's other rows or of the process."""


def step_each(s: "Session", more, each) -> None:
    """``Driver.steps`` for a driver that runs a cycle when asked: ``s.step()`` in a loop (through ``s.step``,
    so a wrapper a server puts on it -- its model lock -- holds for each cycle)."""
    while not s.finished and more():
        asked = time.perf_counter()
        each(s.step(), asked)


def shapes_of(view: list) -> list[list[list[int]]]:
    return [[list(t.shape) for t in layer] for layer in view]


class Solo:
    """The driver of a session of its own: a one-row ``Rows``, prefilled at once."""

    def __init__(self, s: "Session", static_shapes: bool, graphs):
        self.rows: Rows | None = Rows(s.models, static_shapes, graphs)  # None once released
        with torch.inference_mode():
            self.rows.prefill([s])

    def step_request(self, s: "Session") -> Cycle:
        cycles, _, _, sw = self.rows.step([s])
        sw.stop()
        return cycles[0]

    def steps(self, s: "Session", more, each) -> None:
        step_each(s, more, each)

    def view(self, s: "Session") -> list:
        return [] if self.rows is None else self.rows.target.view(0)

    def cache_bytes(self, s: "Session") -> int:
        return 0 if self.rows is None else self.rows.target.nbytes() + self.rows.draft.nbytes()

    def release(self, s: "Session") -> None:
        self.rows = None  # the only reference to this session's caches: they are freed with it

    def kv_shapes(self, s: "Session") -> list[list[list[int]]]:
        return shapes_of(self.view(s))


class Session(Request):
    """One generation, stepped a cycle at a time. ``step()`` -> Cycle; ``run()`` -> Trace."""

    def __init__(self, engine, prompt: "str | Prompt", policy: Policy, sampling: Sampling, seed: int,
                 max_new_tokens: int, kernel_backend: str, record_topk: int, capture, driver: Driver | None = None,
                 static_shapes: bool | None = False, hooks=None):
        """``driver``: what steps this session (it prefills it too); None: a ``Solo`` driver of its own,
        prefilled now. ``static_shapes``: see ``workbench.engine.runner.Rows`` (None: not this session's own
        setting but its batch's, and not recorded). ``hooks``: ``[(point, fn), ...]`` on this session from its
        prefill on (the prefill's points included), for every cycle after."""
        pairs = as_pairs(hooks)  # checked before anything runs
        super().__init__(engine, prompt, policy, sampling, seed, max_new_tokens, kernel_backend, record_topk,
                         capture, static_shapes=static_shapes)
        for name, fn in pairs:  # on before the driver prefills, so the prefill's points see them
            self.hook_points.add(name, fn)
        self._driver = Solo(self, bool(static_shapes), getattr(engine, "graphs", None)) if driver is None else driver

    @property
    def driver(self) -> Driver:
        """What steps this session: its own ``Solo``, its ``BatchSession``, or a ``Scheduler``."""
        return self._driver

    @property
    def _rows(self) -> Rows:
        """The ``Rows`` holding this session's model state (its driver's; tests and tools read it)."""
        return self._driver.rows

    def kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The target cache as (keys, values) per layer, [1, kv_heads, start, head_dim] each (empty once
        a batch has retired this request). A hybrid target's linear-attention layers give (conv window
        [1, conv_dim, K-1], recurrent state [1, HV, Dk, Dv]) instead.

        Views of the cache's buffers, valid until the next step (which writes into them); ``.clone()``
        what you keep."""
        return self._driver.view(self)

    def cache_bytes(self) -> int:
        """Bytes of committed model state (target and drafter) this session holds."""
        return self._driver.cache_bytes(self)

    def kv_shapes(self) -> list[list[list[int]]]:
        """The shapes of ``kv_cache()``'s tensors per layer, without the tensors."""
        return self._driver.kv_shapes(self)

    @torch.inference_mode()
    def step(self, hooks=None) -> Cycle:
        """Run one draft/verify cycle and return its record. ``hooks``: ``[(point, fn), ...]`` for this
        cycle only (``Session.hooks``; ``workbench.engine.hooks.POINTS``), removed after it, also on error."""
        self._check_not_finished()
        if hooks is None:
            return self._driver.step_request(self)
        with self.hooks(hooks):
            return self._driver.step_request(self)

    @torch.inference_mode()
    def step_while(self, more, each) -> None:
        """Cycles while this session has not finished and ``more()`` holds, each handed to ``each(c, asked)``
        as it is made (``asked``: ``time.perf_counter()`` when it was asked for). A server's streamed run
        steps this way: under a batching driver the session stays in the batch between cycles."""
        self._check_not_finished()
        self._driver.steps(self, more, each)

    def _check_not_finished(self) -> None:
        """SessionFinished, saying why and how to go on, once the session has finished."""
        if self.finished:
            raise SessionFinished(
                f"session finished ({self.finish_reason}) after {len(self.generated)} new tokens in "
                f"{len(self.cycles)} cycles; start a new session, or run(max_new_tokens=N) with a larger N"
            )

    def run(self, max_new_tokens: int | None = None) -> Trace:
        """Step until end-of-text or ``max_new_tokens`` generated in all (the session's limit by default;
        a value sets the limit, as ``s.max_new_tokens = n`` does)."""
        if max_new_tokens is not None:
            self.max_new_tokens = max_new_tokens
        while not self.finished:
            self.step()
        return self.trace

    def run_with_hooks(self, max_new_tokens: int | None = None, hooks=()) -> Trace:
        """``run`` with ``hooks`` (``[(point, fn), ...]``) on every cycle of it, removed at its end, also
        when a hook or a cycle raises (TransformerLens's ``run_with_hooks``)."""
        with self.hooks(hooks):
            return self.run(max_new_tokens)

    def close(self) -> None:
        """End the request now (``BaseSession.close``): a running one finishes as "aborted" (as a vLLM
        session does), and its driver lets go of the model state it holds for it, so a closed session costs
        no cache memory while its records stay readable. Closing again does nothing more."""
        if not self.finished:
            self.finish_reason = "aborted"
            self.trace.finish_reason = "aborted"
        self._driver.release(self)


REPLAYED = ("policy", "temperature", "top_p", "top_k", "seed", "max_new_tokens")  # what meta["changes"] holds


def _initial(meta: dict, key: str, default):
    """A setting as the session started: the header's value, or the first of the values it lists."""
    v = meta.get(key, default)
    return v[0] if isinstance(v, list) and v else v


def _engine_pair(engine) -> tuple[str, str]:
    """(target, drafter) as ``canonical_ref`` names them: a served engine's from its /info, a local one's own."""
    from workbench.engine.loading import canonical_ref

    info = getattr(engine, "info", None)
    models = info.get("models") if isinstance(info, dict) else None
    t, d = (models["target"], models["draft"]) if models else (engine.models.target_dir, engine.models.draft_dir)
    return canonical_ref(t), canonical_ref(d)


def _load_hint(target: str, draft: str) -> str:
    from workbench.engine.loading import DEFAULT_DRAFT, DEFAULT_TARGET, PAIRS, model_ref

    for name, (t, d) in {None: (DEFAULT_TARGET, DEFAULT_DRAFT), **PAIRS}.items():
        if (model_ref(t), model_ref(d)) == (target, draft):
            return "wb.load()" if name is None else f"wb.load({name!r})"
    return f"wb.load(target={target!r}, draft={draft!r})"


def check_replayable(trace: Trace, engine) -> list[dict]:
    """Refuse, in one line, a trace ``engine`` would not re-run: recorded by another engine, on another
    pair, or with a change replay cannot apply. Returns the changes, checked."""
    from workbench.engine.loading import canonical_ref

    m = trace.meta
    if not isinstance(m.get("prompt_ids"), list):
        raise ValueError("this trace has no prompt_ids in its header, so it cannot be replayed")
    recorded = str(m.get("engine", "workbench"))
    if not recorded.startswith("workbench"):
        raise ValueError(f"this trace was recorded by {recorded} (trace.meta['engine']); replay re-runs the "
                         "workbench engine's own traces: to run its prompt here, start "
                         "engine.session(prompt_ids=trace.meta['prompt_ids'])")
    if m.get("target") is not None and m.get("draft") is not None:
        theirs = canonical_ref(m["target"]), canonical_ref(m["draft"])
        mine = _engine_pair(engine)
        if theirs != mine:
            raise ValueError(f"this trace ran target {theirs[0]!r} with drafter {theirs[1]!r}; this engine holds "
                             f"target {mine[0]!r} with drafter {mine[1]!r}, so its tokens would differ: replay it "
                             f"on {_load_hint(*theirs)}")
    n = len(trace.cycles)
    forced = [c.index for c in trace.cycles if c.replaced]
    if forced:
        raise ValueError(f"cycle(s) {', '.join(map(str, forced[:5]))}{' ...' if len(forced) > 5 else ''} of this "
                         "trace had a stage's output replaced by a hook (Cycle.replaced); replay re-runs the engine "
                         "without hooks, so it would not reproduce them")
    changes = m.get("changes", [])
    if not isinstance(changes, list):
        raise ValueError(f"trace.meta['changes']={changes!r:.80} is not a list of changes; fix or drop it")
    for k, c in enumerate(changes):
        where = f"trace.meta['changes'][{k}]"
        if not isinstance(c, dict) or not {"cycle", "name", "value"} <= set(c):
            raise ValueError(f"{where}={c!r:.80} is not a {{'cycle', 'name', 'value'}} record; fix or drop it")
        if c["name"] not in REPLAYED:
            raise ValueError(f"{where} names the setting {c['name']!r:.40}, which replay does not know (one of "
                             f"{', '.join(REPLAYED)}); fix the name or drop the entry")
        cycle = c["cycle"]
        if isinstance(cycle, bool) or not isinstance(cycle, int) or not 0 <= cycle <= n:
            raise ValueError(f"{where} has cycle={cycle!r:.40}: give the cycle it applies from, an integer "
                             f"from 0 to {n} (the trace's cycles)")
    return list(changes)


def replay(engine, trace: "Trace | str | os.PathLike", **kw) -> Session:
    """Re-run ``trace`` (or the trace saved at that path) on ``engine``: its prompt ids and starting
    settings, then each recorded change (``trace.changes()``) before the cycle it applied from, for as
    many cycles as the trace has. With the same models on the same device this gives the same tokens,
    cycle for cycle (sampling included: the seed and every re-seed are in the trace). A trace of another
    engine or another pair, or a change replay cannot apply, is refused first. ``kw`` overrides session
    arguments (e.g. ``kernel_backend``). Returns the new session."""
    from workbench.engine.policies import parse_policy

    if isinstance(trace, (str, os.PathLike)):
        trace = Trace.load(trace)
    if not isinstance(trace, Trace):
        raise TypeError(f"replay() takes a wb.Trace or a saved trace's path, got {type(trace).__name__}")
    m = trace.meta
    changes = check_replayable(trace, engine)
    limit_changed = any(c["name"] == "max_new_tokens" for c in changes)
    args = dict(policy=parse_policy(str(_initial(m, "policy", "ddtree:32"))),
                temperature=_initial(m, "temperature", 0.0), top_p=_initial(m, "top_p", 1.0),
                top_k=_initial(m, "top_k", 0), seed=_initial(m, "seed", 0),
                # a trace written before max_new_tokens was recorded: its own length, when no change says otherwise
                max_new_tokens=m.get("max_new_tokens") or (max(trace.new_tokens, 1) if not limit_changed
                                                           else DEFAULT_MAX_NEW_TOKENS),
                kernel_backend=m.get("kernel_backend"), static_shapes=True if m.get("static_shapes") else None)
    args.update(kw)
    s = engine.session(prompt_ids=m["prompt_ids"], **args)

    def apply(i: int) -> None:
        for c in changes:
            if c.get("cycle") == i:
                setattr(s, c["name"], parse_policy(c["value"]) if c["name"] == "policy" else c["value"])

    for i in range(len(trace.cycles)):
        apply(i)
        if s.finished:
            break
        s.step()
    apply(len(trace.cycles))
    return s
