"""Continuous batching: one driver for many sessions, their pending steps run as rows of one cycle.

A ``Scheduler`` owns one ``Rows`` and a worker thread. Sessions it drives (``scheduler.session(...)``) are
ordinary ``Session`` objects: their ``step()`` (and so ``run()``) hands the scheduler a ticket and waits
for the cycle that served it. The worker, in a loop:

1. retires the rows of released sessions (``release``) and admits new sessions (one prefill, an EXTEND
   over every prompt that arrived together, whose rows join the running ones: ``Rows.admit``; sessions a
   caller said are on their way, ``arriving()``, are waited for first, at most ``join_seconds``);
2. gathers the pending steps: after a cycle it waits for the sessions that were in it to ask again (a
   client's next request takes a round trip), and once for each new session that has not asked yet
   (clients that open sessions together start them together: without the wait the first to ask would run
   a cycle alone while the others' rows are copied aside and back), each within its own window: a session
   of the last cycle never longer than ``gather_seconds`` nor ``gather_share`` of the last cycle's time (a
   straggler costs the ready sessions at most that), a new one at most ``join_seconds``, and one released
   meanwhile not at all; then it takes the oldest tickets first; ``stats`` counts how often it waited, for
   how long, and how often it ran without one;
3. runs one cycle over the chosen sessions: same kernel backend, at most ``max_rows`` of them and at
   most ``max_nodes`` verify nodes (rows x the largest tree); a session with a shape capture on runs
   alone (captures record one-row forwards). Rows whose sessions did not ask sit the cycle out: they are
   copied out (``Rows.take``, into ``parked``) and stay out until their session asks again, when they are
   appended (``Rows.merge``), so an idle client costs no compute, and a finished session that its client
   has not closed yet is copied once, not once per cycle of the others.

A run (``scheduler.steps(s, more, each)``, a server's streamed ``/run``) is a standing ticket: after each of
its cycles the worker hands the record over (``each``) and, while ``more()`` holds and the session has not
finished, puts the ticket back itself (as the newest), so the session is in the next gather without its
thread having to wake and ask again; when ``more()`` fails (its reader is behind) the ticket lapses and
the caller asks again once it may.

Each session sees exactly its own generation: its own settings (read at each cycle's start), its own
generator (the verify samples row by row from each request's generator), its own Cycle records. Only
the forwards' records show the batched shapes ([rows, nodes]) and the stage times are the shared cycle's.

Fairness: tickets are served oldest first, and the oldest ticket always runs, so with ``n`` sessions a
step waits at most ``n - 1`` cycles; ``stats`` counts the most cycles any ticket waited.
Sessions with static shapes or CUDA graphs cannot join running rows (their buffers are fixed); their
caller drives them apart (``workbench.serve.store``).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from dataclasses import dataclass, field

import torch

from workbench.engine.runner import Rows, static_nodes
from workbench.engine.session import shapes_of
from workbench.records.cycle import Cycle


COUNT_EVERY = 8  # a run going on has its cache bytes and KV shapes counted every this many of its cycles


@dataclass(frozen=True)
class BatchLimits:
    """What one batched cycle may hold, and how long the worker gathers steps before it runs one."""

    max_rows: int = 16  # sessions per cycle (rows of the draft and verify forwards)
    max_nodes: int = 4096  # rows x padded tree nodes per verify (the verify's token rows)
    gather_seconds: float = 0.02  # the most a cycle waits for the last cycle's sessions to ask again
    # ... and at most this share of the last cycle's time: waiting w for a straggler costs every ready row w,
    # while running without it costs the straggler one cycle, so the wait stays a fraction of a cycle
    gather_share: float = 0.5
    gather_floor: float = 0.003  # but never below this (a client's round trip on loopback), within gather_seconds
    # ... except for sessions admitted since the last gather, waited for once up to this long: clients that
    # opened sessions together send their first requests a few ms apart (8 /run requests on loopback: 5-10 ms),
    # and a cycle run without some of them splits the batch for good (their rows copied aside and back, their
    # cycles one behind: 6% of an 8-client round on the embedded pair when a 5 ms window cut it)
    join_seconds: float = 0.02  # (also the most a prefill waits for sessions said to be arriving)

    def __post_init__(self):
        for name in ("max_rows", "max_nodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive integer")
        for name, top in (("gather_seconds", 10), ("gather_share", 10), ("gather_floor", 10), ("join_seconds", 10)):
            g = getattr(self, name)
            if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g < top:
                raise ValueError(f"{name}={g!r} must be a number from 0 to {top}")

    def window(self, last_cycle_seconds: float) -> float:
        """How long a gather may wait after a cycle of ``last_cycle_seconds``."""
        return min(self.gather_seconds, max(self.gather_floor, self.gather_share * last_cycle_seconds))


@dataclass(eq=False)
class _Ticket:
    session: object
    seq: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Cycle | None = None
    error: BaseException | None = None
    waited: int = 0  # cycles that ran while this ticket waited
    standing: tuple | None = None  # a run's (more, each): re-armed after each cycle while more() holds
    asked: float = 0.0  # when the ticket was (re-)armed: time.perf_counter()


@dataclass
class SchedulerStats:
    cycles: int = 0
    rows_stepped: int = 0  # sum over cycles of the rows in each
    most_rows: int = 0
    most_waited: int = 0  # the most cycles any ticket waited
    prefills: int = 0
    subset_cycles: int = 0  # cycles that left idle rows out (copied out and back)
    gathers_waited: int = 0  # gathers that waited for a session of the last cycle to ask again
    gather_wait_seconds: float = 0.0  # their total wait
    gather_wait_max: float = 0.0  # the longest one
    gathers_cut: int = 0  # gathers whose window ended before every such session asked (it ran without them)


class Scheduler:
    """The driver of every session it creates; see the module's docstring.

    ``lock``: held around every forward (shared with other model users, e.g. sessions driven apart);
    ``before_cycle``: called in the worker before each cycle and prefill (may raise to refuse it, e.g. a
    server shutting down: the error reaches the tickets); ``threads``: torch CPU threads for the worker."""

    def __init__(self, engine, limits: BatchLimits = BatchLimits(), lock: threading.Lock | None = None,
                 before_cycle=None, threads: int | None = None):
        if engine.graphs is not None:
            raise ValueError("a batching scheduler needs dynamic shapes; this engine captures CUDA graphs "
                             "(static shapes): load without cuda_graphs, or drive its sessions apart")
        self.engine, self.limits = engine, limits
        self.lock = lock or threading.Lock()
        self.before_cycle = before_cycle or (lambda: None)
        self.threads = threads
        self.rows = Rows(engine.models)
        self.order: list = []  # the sessions of self.rows, in row order
        self.parked: list[tuple[Rows, list]] = []  # rows that sat a cycle out, with their sessions (in row order)
        self.stats = SchedulerStats()
        self._cond = threading.Condition()
        self._steps: dict[object, _Ticket] = {}  # session -> its pending step (one per session)
        self._admits: list[_Ticket] = []
        self._arriving = 0  # sessions being made elsewhere (``arriving()``) that no ticket holds yet
        self._releases: list = []
        self._seq = itertools.count()
        self._last: list = []  # the sessions of the last cycle (the gather waits for them)
        self._new: list = []  # sessions admitted that no gather has waited for yet (one wait each, at most)
        self._last_seconds = 0.0  # how long the last cycle took (the gather's window is a share of it)
        self._bytes: dict[int, tuple] = {}  # id(session) -> (committed bytes, view shapes) after its last cycle
        self._stopped = False
        self._thread = threading.Thread(target=self._work, name="workbench-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the sessions' side (any thread)
    def session(self, prompt=None, arrival: dict | None = None, **kw):
        """A new session driven here (``engine.session``'s arguments), prefilled with whatever else arrived
        before this returns. ``arrival``: the one ``arriving()`` gave for it."""
        s = self.engine.session(prompt, driver=self, **kw)
        self._wait(self._submit(s, admit=True, arrival=arrival))
        return s

    @contextlib.contextmanager
    def arriving(self):
        """Around making a session elsewhere (a server checking and encoding its prompt) up to ``session(...,
        arrival=...)``: a prefill about to run waits for it, at most ``join_seconds``, so that sessions opened
        together are prefilled together (one EXTEND, as a batch's), not the first alone and the rest after it.
        -> the arrival to pass to ``session``."""
        arrival = {"settled": False}
        with self._cond:
            self._arriving += 1
        try:
            yield arrival
        finally:
            self.settle(arrival)

    def settle(self, arrival: dict | None) -> None:
        """``arrival``'s session will not be made here (refused, or driven apart): no prefill waits for it."""
        with self._cond:
            self._settled(arrival)

    def _settled(self, arrival: dict | None) -> None:
        if arrival is not None and not arrival["settled"]:  # (self._cond held)
            arrival["settled"] = True
            self._arriving -= 1
            self._cond.notify_all()

    def step_request(self, s) -> Cycle:
        return self._wait(self._submit(s))

    def steps(self, s, more, each) -> None:
        """Cycles of ``s`` while it has not finished and ``more()`` holds, each handed to ``each(c, asked)`` in
        the worker as it is made (see the module's docstring); raises a failed cycle's error."""
        while not s.finished and more():
            self._wait(self._submit(s, standing=(more, each)))

    def _submit(self, s, admit: bool = False, standing: tuple | None = None, arrival: dict | None = None) -> _Ticket:
        with self._cond:
            self._settled(arrival)
            if self._stopped:
                raise RuntimeError("the scheduler has stopped")
            t = _Ticket(s, next(self._seq), standing=standing, asked=time.perf_counter())
            if admit:
                self._admits.append(t)
            else:
                if s in self._steps:
                    raise RuntimeError("this session already has a step pending; step it from one thread at a time")
                self._steps[s] = t
            self._cond.notify_all()
        return t

    @staticmethod
    def _wait(t: _Ticket):
        t.done.wait()
        if t.error is not None:
            raise t.error
        return t.result

    def release(self, s, timeout: float = 60.0) -> None:
        """``s`` is gone (deleted, expired): its rows leave, and the scheduler keeps no reference to it,
        by the time this returns (the worker retires it between cycles)."""
        with self._cond:
            if self._stopped:
                self._forget([s])
                return
            self._releases.append(s)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._stopped or not (any(x is s for x in self._releases) or self._holds(s)),
                                timeout=timeout)

    def view(self, s) -> list:
        with self.lock:
            b = self._row(s)
            if b is not None:
                return self.rows.target.view(b)
            for rows, sessions in self.parked:
                j = next((j for j, x in enumerate(sessions) if x is s), None)
                if j is not None:
                    return rows.target.view(j)
            return []

    @property
    def rows_held(self) -> int:
        """Rows of model state held: in the batch, and parked."""
        return self.rows.rows + sum(rows.rows for rows, _ in self.parked)

    def _holds(self, s) -> bool:
        return any(s is x for x in self.order) or any(s is x for _, group in self.parked for x in group)

    def cache_bytes(self, s) -> int:
        # The worker's count (no lock: a reply never waits for the cycle in flight) after the session's last
        # forward, or, while a run of it goes on, after one of its last COUNT_EVERY cycles.
        return self._bytes.get(id(s), (0, []))[0]

    def kv_shapes(self, s) -> list:
        return self._bytes.get(id(s), (0, []))[1]  # (a reply never waits for the cycle in flight)

    def _row(self, s) -> int | None:
        return next((i for i, x in enumerate(self.order) if x is s), None)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker; pending and later steps are refused."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the worker
    def _work(self) -> None:
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        while self._pass():
            pass

    def _pass(self) -> bool:
        """One pass of the worker: retire, admit, one cycle. -> False once stopped. (A method, so that
        nothing of a pass -- its sessions, its tickets -- stays referenced while the worker waits.)"""
        with self._cond:
            while not (self._stopped or self._steps or self._admits or self._releases):
                self._cond.wait()
            if self._admits and self._arriving:  # sessions opened together: one prefill for them all
                self._cond.wait_for(lambda: self._stopped or not self._arriving, timeout=self.limits.join_seconds)
            if self._stopped:
                self._fail_all(RuntimeError("the scheduler has stopped"))
                return False
            releases, self._releases = self._releases, []
            admits, self._admits = self._admits, []
        with torch.inference_mode():
            if releases:
                self._retire(releases)
            # One prefill for the new prompts; a session capturing shapes alone (captures are one-row).
            plain = [t for t in admits if t.session.capture is None]
            for group in ([plain] if plain else []) + [[t] for t in admits if t.session.capture is not None]:
                self._admit(group)
            tickets = self._gather()
            if tickets:
                self._cycle(tickets)
        return True

    def _fail_all(self, err: BaseException) -> None:
        for t in [*self._steps.values(), *self._admits]:
            t.error = err
            t.done.set()
        self._steps.clear()
        self._admits.clear()

    def _retire(self, gone: list) -> None:
        out = lambda group: [i for i, s in enumerate(group) if not any(s is g for g in gone)]  # noqa: E731
        keep = out(self.order)
        parked = []
        with self.lock:
            if len(keep) != len(self.order):
                self.rows.select(keep)
            for rows, group in self.parked:
                stay = out(group)
                if len(stay) != len(group) and stay:
                    rows.select(stay)
                if stay:
                    parked.append((rows, [group[i] for i in stay]))
        with self._cond:
            self.order = [self.order[i] for i in keep]
            self.parked = parked
            self._forget(gone)
            self._cond.notify_all()  # release() waits for this

    def _forget(self, gone: list) -> None:
        self._last = [s for s in self._last if not any(s is g for g in gone)]
        self._new = [s for s in self._new if not any(s is g for g in gone)]
        for s in gone:
            self._bytes.pop(id(s), None)

    def _admit(self, tickets: list[_Ticket]) -> None:
        reqs = [t.session for t in tickets]
        try:
            with self.lock:
                self.before_cycle()
                self.rows.admit(reqs)
            self.order += reqs
            self._new += reqs
            self.stats.prefills += 1
            self._count_bytes(reqs)
        except BaseException as e:  # noqa: BLE001 - the error belongs to the sessions that asked
            for t in tickets:
                t.error = e
        for t in tickets:
            t.done.set()

    def _gather(self) -> list[_Ticket]:
        """The pending tickets to run now, oldest first, within the limits (the oldest always runs)."""
        lim = self.limits
        with self._cond:
            if not self._steps:  # nothing asks (a pass that only admitted or retired): nothing to gather
                return []
            live = lambda group: [s for s in group if not s.finished and self._holds(s)]  # noqa: E731
            last = live(self._last)
            new = [s for s in live(self._new) if not any(s is x for x in last)]
            self._new = []
            if (last or new) and lim.gather_seconds:
                self._wait_for(last, new)
            pending = sorted(self._steps.values(), key=lambda t: t.seq)
            if not pending:
                return []
            first = pending[0].session
            key = (first.kernel_backend, first.capture is not None)
            chosen, widest = [], 0
            for t in pending:
                s = t.session
                if (s.kernel_backend, s.capture is not None) != key or (key[1] and chosen):
                    continue
                nodes = max(widest, static_nodes(s.policy, self.engine.models.block_size))
                if chosen and (len(chosen) >= lim.max_rows or (len(chosen) + 1) * nodes > lim.max_nodes):
                    break
                chosen.append(t)
                widest = nodes
            for t in chosen:
                del self._steps[t.session]
            for t in self._steps.values():
                t.waited += 1
                self.stats.most_waited = max(self.stats.most_waited, t.waited)
        return chosen

    def _wait_for(self, last: list, new: list) -> None:
        """Wait (``self._cond`` held) for the sessions of the last cycle to ask again, at most ``window`` of the
        last cycle, and for new sessions to ask, at most ``join_seconds``: each group only within its own window,
        and a session released meanwhile is not waited for (release() notifies)."""
        short = self.limits.window(self._last_seconds)
        long = max(short, self.limits.join_seconds) if new else short

        def unasked(group: list) -> list:
            return [s for s in group if s not in self._steps and not any(s is r for r in self._releases)]

        def awaited(elapsed: float) -> list:
            return unasked((last if elapsed < short else []) + (new if elapsed < long else []))

        if not awaited(0.0):
            return
        t0 = time.perf_counter()
        while not self._stopped:
            elapsed = time.perf_counter() - t0
            if not awaited(elapsed):
                break
            self._cond.wait(timeout=min(d for d in (short, long) if d > elapsed) - elapsed)
        waited, st = time.perf_counter() - t0, self.stats
        st.gathers_waited += 1
        st.gather_wait_seconds += waited
        st.gather_wait_max = max(st.gather_wait_max, waited)
        # cut: the window ran out before some session it waited for asked
        st.gathers_cut += bool(unasked(last + new))

    def _cycle(self, tickets: list[_Ticket]) -> None:
        t0 = time.perf_counter()
        try:
            with self.lock:
                self.before_cycle()
                self._unpark([t.session for t in tickets])
                tickets = sorted(tickets, key=lambda t: self._row(t.session))  # stepped in row order
                reqs = [t.session for t in tickets]
                rows = [self._row(s) for s in reqs]
                idle = [i for i in range(len(self.order)) if i not in rows]
                if idle:  # the rows that sit this cycle out wait in a copy until their session asks again
                    self.parked.append((self.rows.take(idle), [self.order[i] for i in idle]))
                    self.rows.select(rows)
                    self.order = reqs
                    self.stats.subset_cycles += 1
                cycles, _, _, sw = self.rows.step(reqs)
                sw.stop()
            for t, c in zip(tickets, cycles):
                t.result = c
            again = self._hand_over(tickets)
            # A run going on is counted every COUNT_EVERY of its cycles (the count is O(layers) Python per row:
            # 0.46 ms of a 28 ms batch-8 cycle on the embedded pair); a step, and a run's last cycle, always.
            going = {id(t.session) for t in again}
            self._count_bytes([s for s in reqs if id(s) not in going or len(s.cycles) % COUNT_EVERY == 0])
            st = self.stats
            st.cycles += 1
            st.rows_stepped += len(reqs)
            st.most_rows = max(st.most_rows, len(reqs))
        except BaseException as e:  # noqa: BLE001 - the error belongs to the sessions of this cycle
            again = []
            for t in tickets:
                t.error = e
        self._last, self._last_seconds = [t.session for t in tickets], time.perf_counter() - t0
        with self._cond:
            for t in again:  # as the newest tickets: a run is served as fairly as one asking again at once
                t.seq, t.asked, t.result, t.waited = next(self._seq), time.perf_counter(), None, 0
                self._steps[t.session] = t
        for t in tickets:
            if not any(t is x for x in again):
                t.done.set()

    @staticmethod
    def _hand_over(tickets: list[_Ticket]) -> list[_Ticket]:
        """Each standing ticket's cycle goes to its ``each``; -> the tickets to put back (their run goes on).
        A failing ``each`` ends its run with that error (the others' are not its concern)."""
        again = []
        for t in tickets:
            if t.standing is None:
                continue
            more, each = t.standing
            try:
                each(t.result, t.asked)
                if not t.session.finished and more():
                    again.append(t)
            except BaseException as e:  # noqa: BLE001 - it belongs to the run that asked
                t.error = e
        return again

    def _unpark(self, wanted: list) -> None:
        """The parked rows of ``wanted`` sessions rejoin the batch (appended; a group split where only some of
        its sessions ask). Called with ``self.lock`` held."""
        keep = []
        for rows, group in self.parked:
            back = [j for j, s in enumerate(group) if any(s is w for w in wanted)]
            if len(back) == len(group):
                self.rows.merge(rows)
            elif back:
                self.rows.merge(rows.take(back))
                stay = [j for j in range(len(group)) if j not in back]
                rows.select(stay)
                keep.append((rows, [group[j] for j in stay]))
            else:
                keep.append((rows, group))
                continue
            self.order = self.order + [group[j] for j in back]
        self.parked = keep

    def _count_bytes(self, reqs: list) -> None:
        for s in reqs:
            b = self._row(s)
            if b is not None:
                view = self.rows.target.view(b)
                self._bytes[id(s)] = (self.rows.row_bytes(b), shapes_of(view))
