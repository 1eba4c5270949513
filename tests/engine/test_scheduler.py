"""Requests joining running rows (``Rows.admit`` / ``take`` / ``merge``) and the continuous-batching
``Scheduler``: every request's tokens and records equal the same request run alone."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import workbench as wb
from test_batch import check_same_cycles
from test_engine import tiny_prompts
from tiny_hybrid import make_hybrid_pair
from workbench.engine.runner import Rows
from workbench.engine.scheduler import BatchLimits, Scheduler

POLICIES = [wb.DDTree(12), wb.DFlash(), wb.AR(), wb.DDTree(5), wb.DDTree(30)]
TEMPS = [0.0, 0.0, 0.8, 1.0, 0.0]


class HandDriver:
    """A driver the test steps by hand: the Session API over one Rows it owns."""

    def __init__(self, engine):
        self.rows = Rows(engine.models)

    def step_request(self, s):
        raise RuntimeError("stepped by the test")

    def view(self, s):
        return []

    def cache_bytes(self, s):
        return 0


def alone(engine, prompt, policy, temperature, n=24, seed=3):
    s = engine.session(prompt, policy=policy, temperature=temperature, seed=seed, max_new_tokens=n)
    s.run()
    return s


@torch.inference_mode()
def drive_by_hand(engine, prompts, n=24, seed=3):
    """Two requests start; after two cycles the rest join; from then on, every other cycle leaves the
    last row out (copied out and merged back); finished rows are retired."""
    d = HandDriver(engine)
    mk = lambda i: engine.session(prompts[i], policy=POLICIES[i], temperature=TEMPS[i], seed=seed,  # noqa: E731
                                  max_new_tokens=n, driver=d)
    every = [mk(0), mk(1)]
    live = list(every)
    d.rows.admit(live)
    for _ in range(2):
        d.rows.step(live)[3].stop()
    late = [mk(i) for i in range(2, len(prompts))]
    d.rows.admit(late)
    every += late
    live += late
    turn = 0
    while live:
        keep = [i for i, s in enumerate(live) if not s.finished]
        if len(keep) != len(live):
            d.rows.select(keep)
            live = [live[i] for i in keep]
        if not live:
            break
        turn += 1
        if turn % 2 and len(live) > 1:
            parked = d.rows.take([len(live) - 1])
            d.rows.select(list(range(len(live) - 1)))
            d.rows.step(live[:-1])[3].stop()
            d.rows.merge(parked)
            live = live[:-1] + live[-1:]  # (the parked row follows the others again)
        else:
            d.rows.step(live)[3].stop()
    return every


@pytest.fixture(scope="module")
def hybrid_engine(tmp_path_factory):
    t, d = make_hybrid_pair(tmp_path_factory.mktemp("hyb"), "qwen3_5", seed=4, vocab=40)
    return wb.load(target=t, draft=d)


@pytest.mark.parametrize("which", ["l4-h32", "l6-h32-d2", "hybrid"])
def test_requests_joining_and_sitting_out_running_rows_equal_each_alone(tiny_engines, hybrid_engine, which):
    engine = hybrid_engine if which == "hybrid" else tiny_engines[which]
    prompts = tiny_prompts(engine, len(POLICIES), seed=11)
    got = drive_by_hand(engine, prompts)
    for i, s in enumerate(got):
        ref = alone(engine, prompts[i], POLICIES[i], TEMPS[i])
        assert s.tokens == ref.tokens, (which, i, POLICIES[i], TEMPS[i])
        check_same_cycles(s, ref)
        assert s.finish_reason == ref.finish_reason


@torch.inference_mode()
def test_take_copies_rows_and_merge_appends_them(tiny_engines):
    engine = tiny_engines["l4-h32"]
    prompts = tiny_prompts(engine, 3, seed=2)
    d = HandDriver(engine)
    reqs = [engine.session(p, policy=wb.DDTree(8), max_new_tokens=40, driver=d) for p in prompts]
    d.rows.admit(reqs)
    d.rows.step(reqs)[3].stop()
    before = [[t.clone() for kv in d.rows.target.view(b) for t in kv] for b in range(3)]
    copy = d.rows.take([2, 0])
    assert copy.rows == 2 and d.rows.rows == 3  # a copy: the source keeps its rows
    for row, src in ((0, 2), (1, 0)):
        got = [t for kv in copy.target.view(row) for t in kv]
        assert all(torch.equal(a, b) for a, b in zip(got, before[src]))
    d.rows.select([1])
    d.rows.merge(copy)
    assert d.rows.rows == 3 and d.rows.target.lengths == [reqs[1].start, reqs[2].start, reqs[0].start]
    assert d.rows.draft.rows == 3 and len(d.rows.draft.context) == 3


@torch.inference_mode()
def test_static_rows_refuse_to_admit(tiny_engines):
    engine = tiny_engines["l4-h32"]
    with pytest.raises(ValueError, match="static_shapes=True: a session with static shapes"):
        engine.session("x", static_shapes=True, driver=HandDriver(engine))
    rows = Rows(engine.models, static_shapes=True)
    s = engine.session("ab", max_new_tokens=8)
    rows.prefill([s])
    with pytest.raises(ValueError, match="admit: static shapes fix the rows"):
        rows.admit([engine.session("cd", max_new_tokens=8)])


def run_clients(scheduler, engine, prompts, n=24, seed=3, policies=POLICIES, temps=TEMPS):
    out = [None] * len(prompts)
    errors = []

    def client(i):
        try:
            s = scheduler.session(prompts[i], policy=policies[i], temperature=temps[i], seed=seed, max_new_tokens=n)
            s.run()
            out[i] = s
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


@pytest.mark.parametrize("which", ["l6-h32-d2", "hybrid"])
def test_scheduled_sessions_equal_each_alone_and_share_cycles(tiny_engines, hybrid_engine, which):
    engine = hybrid_engine if which == "hybrid" else tiny_engines[which]
    prompts = tiny_prompts(engine, len(POLICIES), seed=5)
    sch = Scheduler(engine, BatchLimits(gather_seconds=0.05))
    try:
        got = run_clients(sch, engine, prompts)
    finally:
        sch.close()
    for i, s in enumerate(got):
        ref = alone(engine, prompts[i], POLICIES[i], TEMPS[i])
        assert s.tokens == ref.tokens, (which, i)
        check_same_cycles(s, ref)
        assert s.trace.meta["seed"] == ref.trace.meta["seed"] and s.trace.meta["policy"] == ref.trace.meta["policy"]
    st = sch.stats
    assert st.most_rows > 1  # the sessions really shared forwards
    assert st.rows_stepped == sum(len(s.cycles) for s in got) and st.cycles < st.rows_stepped
    assert st.most_waited <= len(prompts) - 1  # the fairness bound


def test_scheduler_limits_rows_and_nodes_per_cycle(tiny_engines):
    engine = tiny_engines["l4-h32"]
    prompts = tiny_prompts(engine, 5, seed=8)
    pols = [wb.DDTree(7)] * 5  # 8 nodes each
    sch = Scheduler(engine, BatchLimits(max_rows=4, max_nodes=24, gather_seconds=0.05))  # 24 nodes: 3 rows of 8
    sizes = []
    orig = sch.rows.step

    def spy(reqs):
        sizes.append(len(reqs))
        return orig(reqs)

    sch.rows.step = spy
    try:
        got = run_clients(sch, engine, prompts, policies=pols, temps=[0.0] * 5)
    finally:
        sch.close()
    assert max(sizes) == 3 and sch.stats.most_rows == 3
    for p, s in zip(prompts, got):
        assert s.tokens == alone(engine, p, wb.DDTree(7), 0.0).tokens


def test_a_released_session_leaves_the_rows_and_a_closed_scheduler_refuses(tiny_engines):
    engine = tiny_engines["l4-h32"]
    sch = Scheduler(engine)
    try:
        a = sch.session("ab", policy=wb.DDTree(4), max_new_tokens=30)
        b = sch.session("cd", policy=wb.DDTree(4), max_new_tokens=30)
        a.step()
        assert sch.rows_held == 2 and sch.rows.rows == 1 and a.cache_bytes() > 0  # b's row sat out: parked
        kv = b.kv_cache()  # a parked row is still read
        assert kv and kv[0][0].shape[-2] == b.start and b.cache_bytes() > 0
        sch.release(a)
        b.step()  # the worker retires a's rows before b's cycle
        assert sch.rows_held == 1 and sch.rows.rows == 1 and sch.order == [b] and not sch.parked
        assert b.tokens == alone(engine, "cd", wb.DDTree(4), 0.0, n=30).tokens[: len(b.tokens)]
        sch.release(b)
        c = sch.session("ef", policy=wb.DDTree(4), max_new_tokens=12)  # rows emptied, then a new one joins
        assert sch.rows_held == 1 and c.run().new_tokens == 12
        assert c.tokens == alone(engine, "ef", wb.DDTree(4), 0.0, n=12).tokens
    finally:
        sch.close()
    with pytest.raises(RuntimeError, match="the scheduler has stopped"):
        b.step()


def test_a_failing_cycle_reaches_its_sessions_not_the_worker(tiny_engines):
    engine = tiny_engines["l4-h32"]
    calls = {"n": 0}

    def refuse_second():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("refused by before_cycle")

    sch = Scheduler(engine, before_cycle=refuse_second)
    try:
        s = sch.session("ab", policy=wb.DDTree(4), max_new_tokens=20)  # call 1: the prefill
        with pytest.raises(RuntimeError, match="refused by before_cycle"):
            s.step()  # call 2
        s.step()  # the worker is alive; the session goes on where it was
        assert len(s.cycles) == 1
    finally:
        sch.close()


def test_standing_runs_stay_in_the_batch_and_equal_each_alone(tiny_engines):
    """``Scheduler.steps``: each cycle reaches ``each`` in order, the run never makes a gather wait for its
    thread to ask again (the worker re-arms it), a run whose ``more()`` lapses goes on when asked again,
    and a failing ``each`` ends its own run only."""
    engine = tiny_engines["l4-h32"]
    prompts = tiny_prompts(engine, 3, seed=11)
    pols = [wb.DDTree(6), wb.DFlash(), wb.DDTree(9)]
    sch = Scheduler(engine, BatchLimits(gather_seconds=0.5, gather_floor=0.5))  # a wait would be counted
    seen = [[] for _ in range(3)]
    try:
        sessions = [sch.session(p, policy=pol, max_new_tokens=24) for p, pol in zip(prompts, pols)]
        go = threading.Barrier(3)

        def client(i):
            s = sessions[i]
            go.wait()
            lapses = 0
            while not s.finished:  # run 1 lapses every third cycle; its caller asks again
                n0 = len(seen[i])
                more = (lambda: len(seen[i]) - n0 < 3) if i == 1 else (lambda: True)
                sch.steps(s, more, lambda c, asked: seen[i].append(
                    (c.index, asked <= time.perf_counter(), threading.current_thread().name)))
                lapses += 1
            return s, lapses

        with ThreadPoolExecutor(3) as pool:  # a failing client raises here
            got = list(pool.map(client, range(3)))
        st = sch.stats
        assert st.most_rows == 3
        assert st.gathers_waited <= got[1][1]  # only after run 1's lapses (its thread had to ask again)
        for i, (s, lapses) in enumerate(got):
            assert s.tokens == alone(engine, prompts[i], pols[i], 0.0).tokens
            # handed over in the worker, as made: the caller's thread did not wake for each cycle
            assert seen[i] == [(k, True, "workbench-scheduler") for k in range(len(s.cycles))]
            assert (lapses > 1) == (i == 1)

        bad = sch.session(prompts[0], policy=wb.DDTree(4), max_new_tokens=24)

        def boom(c, asked):
            raise RuntimeError("the reader failed")

        with pytest.raises(RuntimeError, match="the reader failed"):
            sch.steps(bad, lambda: True, boom)
        assert len(bad.cycles) == 1
        bad.step()  # the worker is alive, the session goes on
        assert len(bad.cycles) == 2
    finally:
        sch.close()


def test_rows_that_sit_out_are_copied_once_until_their_session_asks_again(tiny_engines):
    """A finished session its client has not closed, or an idle one, is parked once (one ``take``), not
    copied out and back on every cycle of the others; when it asks again it rejoins, and tokens are as alone."""
    engine = tiny_engines["l4-h32"]
    prompts = tiny_prompts(engine, 2, seed=13)
    sch = Scheduler(engine)
    takes = []
    try:
        a = sch.session(prompts[0], policy=wb.DDTree(4), max_new_tokens=30)
        b = sch.session(prompts[1], policy=wb.DDTree(4), max_new_tokens=30)
        orig = sch.rows.take
        sch.rows.take = lambda rows: takes.append(list(rows)) or orig(rows)
        for _ in range(4):
            a.step()  # b sits out four cycles: parked once
        assert takes == [[1]] and sch.rows_held == 2
        b.run()  # b rejoins (a parked in its turn, once) and runs to the end
        assert len(takes) == 2 and b.finished
        a.run()
        assert a.tokens == alone(engine, prompts[0], wb.DDTree(4), 0.0, n=30).tokens
        assert b.tokens == alone(engine, prompts[1], wb.DDTree(4), 0.0, n=30).tokens
    finally:
        sch.close()


def test_sessions_opened_together_start_together_and_are_waited_for_once(tiny_engines):
    """The first gather waits (within its window) for new sessions that have not asked yet, so clients that
    opened sessions together share their first cycle; a new session that does not ask is waited for once."""
    engine = tiny_engines["l4-h32"]
    prompts = tiny_prompts(engine, 2, seed=17)
    sch = Scheduler(engine, BatchLimits(gather_seconds=0.3, gather_floor=0.3))
    sizes = []
    orig = sch.rows.step
    sch.rows.step = lambda reqs: sizes.append(len(reqs)) or orig(reqs)
    try:
        a, b = (sch.session(p, policy=wb.DDTree(4), max_new_tokens=20) for p in prompts)
        late = threading.Timer(0.05, b.step)  # b asks 50 ms after a
        late.start()
        a.step()
        late.join()
        assert sizes == [2]  # one cycle for both: a's gather waited for b
        waited = sch.stats.gathers_waited
        c = sch.session(prompts[0], policy=wb.DDTree(4), max_new_tokens=20)
        a.step()  # waits (at most the window) for a and b of the last cycle and the new c: c never asks
        a.step()
        a.step()  # ... and then neither for c again nor for b, which did not ask in the last cycle
        assert sch.stats.gathers_waited == waited + 1 and sizes[1:] == [1, 1, 1] and len(c.cycles) == 0
    finally:
        sch.close()


def test_a_new_session_is_waited_for_longer_than_a_straggler(tiny_engines):
    """A session just admitted that has not asked yet is waited for up to ``join_seconds`` (its client's first
    request may come several ms after the others'), while a session of the last cycle gets only the short
    window (``gather_share`` of a cycle, at least ``gather_floor``), even when both are awaited at once; a new
    session closed before it asks is waited for only until it is closed."""
    engine = tiny_engines["l4-h32"]
    prompts = tiny_prompts(engine, 2, seed=19)
    sch = Scheduler(engine, BatchLimits(gather_seconds=2.0, gather_share=0.0, gather_floor=0.001, join_seconds=2.0))
    sizes = []
    orig = sch.rows.step
    sch.rows.step = lambda reqs: sizes.append(len(reqs)) or orig(reqs)
    try:
        a, b = (sch.session(p, policy=wb.DDTree(4), max_new_tokens=20) for p in prompts)
        for _ in range(2):
            late = threading.Timer(0.2, b.step)  # b asks 200 ms after a
            late.start()
            a.step()
            late.join()
        # the first time b was new: one cycle for both; the second, a ran alone after 1 ms
        assert sizes == [2, 1, 1]
        assert a.tokens == alone(engine, prompts[0], wb.DDTree(4), 0.0, n=20).tokens[:len(a.tokens)]
        c = sch.session(prompts[1], policy=wb.DDTree(4), max_new_tokens=20)  # new, and closed before it asks
        gone = threading.Timer(0.2, sch.release, args=(c,))
        gone.start()
        t = time.perf_counter()
        a.step()  # waits for c (b, of the last cycle: 1 ms) until c is released, not the whole 2 s
        gone.join()
        assert 0.15 < time.perf_counter() - t < 1.5 and sizes[-1] == 1
    finally:
        sch.close()
    with pytest.raises(ValueError, match="join_seconds"):
        BatchLimits(join_seconds=-1)


def test_a_running_session_is_counted_every_few_cycles_and_exactly_when_its_run_ends(tiny_engines):
    """``cache_bytes`` / ``kv_shapes`` of a session in a standing run: counted every COUNT_EVERY of its
    cycles (the count is per-row Python the batch's cycle would otherwise pay every time), and exactly when
    the run ends or a step returns, so a reply after it reads what the rows hold."""
    from workbench.engine import scheduler as sched_mod

    engine = tiny_engines["l4-h32"]
    sch = Scheduler(engine)
    counted: list[int] = []
    inner = sch._count_bytes

    def spy(reqs):
        counted.extend(len(s.cycles) for s in reqs)
        inner(reqs)

    sch._count_bytes = spy
    try:
        s = sch.session("ab", policy=wb.DFlash(), max_new_tokens=40)
        seen = []
        sch.steps(s, lambda: len(seen) < 12, lambda c, asked: seen.append(c.index))
        n = len(s.cycles)
        assert n >= 12 and not s.finished  # (a run that ends by its bound, mid-generation)
        every = sched_mod.COUNT_EVERY
        assert counted[0] == 0  # admitted
        assert counted[1:] == [k for k in range(1, n) if k % every == 0] + [n]
        assert s.kv_cache()[0][0].shape[-2] == s.start and s.cache_bytes() == sch.rows.row_bytes(0)
        s.step()
        assert counted[-1] == n + 1 and s.kv_cache()[0][0].shape[-2] == s.start
    finally:
        sch.close()
