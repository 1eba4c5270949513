"""Named hook points on the cycle: a request's own observers of each stage, and (for an investigation) the
replacement of a stage's output.

Every request (a ``Session``, each request of a ``BatchSession``, a scheduler's session) holds its own
``HookPoints``: the functions registered at each named point, like TransformerLens's ``HookPoint`` modules
(``blocks.3.attn.hook_pattern``). The cycle (``workbench.engine.runner.Rows``) calls them per row, so in a
batched cycle a request's hooks see its own row only, and two sessions never see each other's hooks. A hook
is ``fn(value, hook) -> None | replacement``: ``value`` is the stage's output for that row, ``hook`` a
``HookCall`` (the point's name, the request, its row, the cycle's ``Rows``). Returning None observes;
returning a value at a replaceable point puts it in place of the stage's output, checked first
(``workbench.engine.replacements``) and recorded in the request's ``Cycle.replaced``. A replaceable point's
hooks get a copy (changed in place and not returned, it changes nothing); the other points' values are the
cycle's own, to be read, not changed.

A cycle whose requests have no hook runs exactly as it did without hook points: ``hooks_for`` returns None
after one attribute test per request and the cycle tests ``is not None`` once per point (no dispatcher, no
per-stage allocation). Scoping (``with session.hooks(...)``, ``session.step(hooks=...)``) is the request's;
this module holds the registry and the per-cycle dispatch.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Every point, in the order a cycle reaches them, with what a hook gets there. The prefill points run once,
# when a request starts: hooks registered before it (``engine.session(..., hooks=...)``, ``capture=``) see them.
POINTS: dict[str, str] = {
    "prefill.hook_begin": "the prompt ids (list[int]), before the target's EXTEND forward",
    "prefill.hook_end": "None, or the exception the prefill raised (it propagates after the hooks)",
    "cycle.hook_begin": "the slots this row drafts (int, 0: none), before the draft forward",
    "cycle.hook_draft_input": "what the draft forward was handed for this row (models.base.DraftInput: context "
                              "features [c, F], context positions [c], block tokens and positions [Bk]; copies, "
                              "made only while such a hook is on), or None (no draft forward)",
    "cycle.hook_draft": "the drafter's output (stages.Draft: logprobs [1, D, V], record), or None (no draft)",
    "cycle.hook_tree": "the tree to verify (ddtree_kernels.Tree, fields [1, n]); replaceable",
    "cycle.hook_compiled": "the compiled tree (ddtree_kernels.CompiledTree: positions [1, n], visibility [1, n, n])",
    "cycle.hook_choices": "the target's choice at every node (int64 [1, n]); replaceable",
    "cycle.hook_accepted": "the accepted path (int64 [L + 1] node indices, root first); replaceable",
    "cycle.hook_committed": "what was committed (stages.Committed: nodes, tokens, bonus, context)",
    "cycle.hook_record": "the request's Cycle record, appended to its trace",
    "cycle.hook_end": "None, or the exception the cycle raised (it propagates after the hooks)",
}
# The points of the prefill: it runs when a session is made, so only hooks given then
# (``engine.session(..., hooks=...)``) see them; one attached to a session later would never run.
PREFILL_POINTS = tuple(p for p in POINTS if p.startswith("prefill."))
# A stage's name stands for the point at its output: ``session.hooks(("tree_build", fn))``.
STAGE_POINTS: dict[str, str] = {
    "draft": "cycle.hook_draft", "tree_build": "cycle.hook_tree", "tree_compile": "cycle.hook_compiled",
    "verify": "cycle.hook_choices", "accept": "cycle.hook_accepted", "commit": "cycle.hook_committed",
    "record": "cycle.hook_record",
}
# The points whose value a hook may replace, and the stage each replacement is recorded under.
REPLACEABLE: dict[str, str] = {"cycle.hook_tree": "tree_build", "cycle.hook_choices": "verify",
                               "cycle.hook_accepted": "accept"}


def point_name(name: str) -> str:
    """The point ``name`` stands for (a point's own name, or a stage's); a one-line ValueError otherwise."""
    if name in POINTS:
        return name
    if isinstance(name, str) and name in STAGE_POINTS:
        return STAGE_POINTS[name]
    raise ValueError(f"no hook point {name!r}; the points are {', '.join(POINTS)} (or a stage's name: "
                     f"{', '.join(STAGE_POINTS)})")


def as_pairs(hooks) -> list[tuple[str, Callable]]:
    """``[(point, fn), ...]`` from a list (or tuple) of pairs, one pair, a dict or None; names resolved, fns
    checked. ``f(*hooks)`` callers pass ``hooks[0]`` when given one argument."""
    if hooks is None:
        return []
    if isinstance(hooks, dict):
        hooks = list(hooks.items())
    elif isinstance(hooks, (tuple, list)) and len(hooks) == 2 and isinstance(hooks[0], str):
        hooks = [hooks]  # one (point, fn) pair
    out = []
    for h in hooks:
        if not (isinstance(h, (tuple, list)) and len(h) == 2):
            raise ValueError(f"a hook is a (point, fn) pair, e.g. ('cycle.hook_tree', fn); got {h!r:.80}")
        name, fn = h
        if not callable(fn):
            raise ValueError(f"the hook for {name!r} is {type(fn).__name__}, not a function fn(value, hook)")
        out.append((point_name(name), fn))
    return out


def refuse_after_prefill(pairs: list[tuple[str, Callable]]) -> None:
    """A one-line ValueError when ``pairs`` (``as_pairs``'s) name a prefill point: they are attached to a session
    whose prefill has run, where such a hook would never fire."""
    late = [name for name, _ in pairs if name in PREFILL_POINTS]
    if late:
        raise ValueError(f"{late[0]}: the prefill ran when the session was made, so a hook there would never run; "
                         f"give it when the session is made: engine.session(..., hooks=[({late[0]!r}, fn)])")


class HookPoints:
    """One request's hooks, by point name. Each point's functions are a tuple replaced on every change, so
    the cycle may read them from another thread (a scheduler's worker) while a caller adds or removes."""

    __slots__ = ("fns",)

    def __init__(self):
        self.fns: dict[str, tuple] = {}  # empty: the cycle skips every point for this request

    def add(self, name: str, fn: Callable) -> Callable[[], None]:
        """Register ``fn`` at ``name`` (a point, or a stage's name); -> a function that removes it again."""
        (name, fn), = as_pairs([(name, fn)])
        fns = dict(self.fns)
        fns[name] = fns.get(name, ()) + (fn,)
        self.fns = fns

        def remove() -> None:
            self.remove(name, fn)

        return remove

    def remove(self, name: str, fn: Callable) -> None:
        """Take ``fn`` off ``name`` (its last registration); nothing when it is not there."""
        name = point_name(name)
        got = list(self.fns.get(name, ()))
        for i in range(len(got) - 1, -1, -1):
            if got[i] is fn:
                del got[i]
                break
        fns = dict(self.fns)
        if got:
            fns[name] = tuple(got)
        else:
            fns.pop(name, None)
        self.fns = fns

    def clear(self) -> None:
        self.fns = {}

    def __bool__(self) -> bool:
        return bool(self.fns)

    def __repr__(self) -> str:
        return "HookPoints(" + ", ".join(f"{k}: {len(v)}" for k, v in self.fns.items()) + ")"


@dataclass(frozen=True, slots=True)
class HookCall:
    """What a hook is told besides the value: where it runs."""

    name: str  # the point, e.g. "cycle.hook_tree"
    request: object  # the request (Session) whose row this is
    row: int  # its row in this cycle's forwards (0 for a session of its own)
    batch: int  # rows in this cycle
    rows: object  # the workbench.engine.runner.Rows running it (its model states: rows.target, rows.draft)
    cycle: int | None  # the index its Cycle record gets (None at the prefill)


class HookReturnError(ValueError):
    """A hook returned a value at a point that takes none (return None to observe)."""


def hooks_for(reqs: list, rows, stopwatch=None, prefill: bool = False) -> "CycleHooks | None":
    """The dispatcher of one cycle (or prefill) over ``reqs``, or None when none of them has a hook: then
    the cycle runs as it would with no hook points at all."""
    for s in reqs:
        if s.hook_points.fns:
            return CycleHooks(reqs, rows, stopwatch, prefill)
    return None


class CycleHooks:
    """Calls each request's hooks at each point of one cycle, row by row, and keeps what they replaced.

    ``stopwatch``: the cycle's; time spent in hooks is counted as "other", so the stage times stay the
    stages' own."""

    def __init__(self, reqs: list, rows, stopwatch=None, prefill: bool = False):
        self.reqs, self.rows, self.stopwatch = reqs, rows, stopwatch
        self.fns = [s.hook_points.fns for s in reqs]  # as the cycle starts: a change mid-cycle applies next cycle
        self.names = {n for f in self.fns for n in f}
        self.cycles = [None if prefill else len(s.trace.cycles) for s in reqs]
        self.replaced: list[list[str]] = [[] for _ in reqs]  # per row: the stages whose output a hook replaced

    def has(self, name: str) -> bool:
        return name in self.names

    def _call(self, name: str, b: int):
        return HookCall(name, self.reqs[b], b, len(self.reqs), self.rows, self.cycles[b])

    def observe(self, name: str, values: list) -> None:
        """Run ``name``'s hooks on each row's value; a returned value is refused (not a replaceable point)."""
        if name not in self.names:
            return
        if self.stopwatch is not None:
            self.stopwatch.start("other")
        for b, fns in enumerate(self.fns):
            for fn in fns.get(name, ()):
                if fn(values[b], self._call(name, b)) is not None:
                    raise HookReturnError(
                        f"a hook on {name} returned a value; only {', '.join(REPLACEABLE)} take a replacement "
                        "(return None to observe)")

    def replace(self, name: str, values: list, check: Callable) -> dict[int, object]:
        """Run ``name``'s hooks on each row's value; a returned value, passed through ``check(value, row)``,
        replaces it for the next hook and for the cycle. -> {row: its replacement} (empty: none)."""
        out: dict[int, object] = {}
        if name not in self.names:
            return out
        if self.stopwatch is not None:
            self.stopwatch.start("other")
        for b, fns in enumerate(self.fns):
            value = values[b]
            for fn in fns.get(name, ()):
                got = fn(value, self._call(name, b))
                if got is not None:  # even the same object: it may have been changed in place
                    value = out[b] = check(got, b)
            if b in out and REPLACEABLE[name] not in self.replaced[b]:
                self.replaced[b].append(REPLACEABLE[name])
        return out

    def end(self, name: str, error: BaseException | None) -> None:
        """The end point (``prefill.hook_end`` / ``cycle.hook_end``) for every row, even when the cycle raised.
        The stage the stopwatch was in goes on afterwards (the caller's bookkeeping stays timed in it)."""
        if name in self.names:
            stage = None if self.stopwatch is None else self.stopwatch.stage
            self.observe(name, [error] * len(self.reqs))
            if stage is not None:
                self.stopwatch.start(stage)
