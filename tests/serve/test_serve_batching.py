"""The served engine batches its clients: 8 clients with mixed policies and temperatures, stepping at once,
each get exactly the tokens and cycle records of the same session run alone, while their steps share
forwards (the scheduler's counts); with batching off, the same outputs one cycle at a time."""
from __future__ import annotations

import threading

import pytest

import workbench as wb
from shared_checks import same_cycle

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

CLIENTS = [
    dict(prompt="t1 t2 t3", policy=wb.DDTree(6), temperature=0.0),
    dict(prompt="t5 t9", policy=wb.DFlash(), temperature=0.0),
    dict(prompt="t7 t7 t8", policy=wb.DDTree(4), temperature=1.0, top_k=5, seed=2),
    dict(prompt="t3", policy=wb.AR(), temperature=0.0),
    dict(prompt="t2 t2 t9 t4", policy=wb.DDTree(12), temperature=0.8, top_p=0.9, seed=1),
    dict(prompt="t6 t1", policy=wb.DDTree(6), temperature=0.0),
    dict(prompt="t8 t8", policy=wb.DFlash(), temperature=0.7, seed=4),
    dict(prompt="t4 t5 t6 t7 t8", policy=wb.DDTree(20), temperature=0.0),
]
MAX_NEW = 28


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    from tiny_models import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("batch"), vocab=40, hidden=32, layers=3, layer_ids=(0, 1),
                     block_size=6, seed=5, eos=False)
    return wb.load(target=t, draft=d)


def serve_clients(eng, batching: bool):
    from workbench.serve import EngineServer, Limits

    srv = EngineServer(eng, port=0, limits=Limits(max_sessions=8, max_new_tokens=64, max_budget=48,
                                                  batching=batching)).start()
    out, errors = [None] * len(CLIENTS), []
    start = threading.Barrier(len(CLIENTS))

    def client(i):
        try:
            kw = dict(CLIENTS[i])
            remote = wb.connect(srv.url, token=srv.token)
            # every field as it arrives: the records are compared after the server has stopped
            s = remote.session(kw.pop("prompt"), max_new_tokens=MAX_NEW, records="full", **kw)
            start.wait(30)
            if i % 2:
                s.run()  # the server loops over the cycles
            else:
                while not s.finished:  # one HTTP step per cycle
                    s.step()
            out[i] = s
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(CLIENTS))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        stats = srv.store.scheduler.stats if srv.store.scheduler is not None else None
    finally:
        srv.stop()
    assert not errors, errors
    return out, stats


@pytest.mark.parametrize("batching", [True, False])
def test_every_client_sees_its_own_session_as_if_alone(eng, batching):
    got, stats = serve_clients(eng, batching)
    for kw, s in zip(CLIENTS, got):
        kw = dict(kw)
        ref = eng.session(kw.pop("prompt"), max_new_tokens=MAX_NEW, **kw)
        ref.run()
        assert s.tokens == ref.tokens, kw
        assert len(s.cycles) == len(ref.cycles), kw
        for a, b in zip(s.cycles, ref.cycles):
            same_cycle(a, b)
        assert s.finish_reason == ref.finish_reason
    if batching:
        assert stats.most_rows > 1 and stats.cycles < stats.rows_stepped  # steps shared forwards
        assert stats.most_waited <= len(CLIENTS) - 1
    else:
        assert stats is None


def test_sessions_opened_together_share_one_prefill_and_one_alone_does_not_wait(eng):
    """A session is said to be arriving from the moment its request reaches the store: a prefill about to run
    waits for the others (at most join_seconds, 5 s here), so sessions opened together are prefilled as a
    batch's are, not the first alone; a lone one, or one refused on its way, holds no prefill up."""
    import time

    from workbench.engine.scheduler import BatchLimits
    from workbench.serve import Limits, ServeError, SessionStore

    store = SessionStore(eng, Limits(max_sessions=4, max_new_tokens=8))
    store.scheduler.limits = BatchLimits(join_seconds=5.0)
    inside = {p: threading.Event() for p in ("t1 t2 t3", "t4 t5")}
    go = threading.Event()
    check = store.check_prompt

    def held_check(prompt):  # both requests are on their way before either is submitted
        inside.get(prompt, go).set()
        if prompt == "t4 t5":
            go.wait(10)
        check(prompt)

    store.check_prompt = held_check
    made = []
    threads = [threading.Thread(target=lambda p=p: made.append(store.create(p, wb.DDTree(3), max_new_tokens=4)))
               for p in ("t4 t5", "t1 t2 t3")]
    try:
        t0 = time.perf_counter()
        threads[0].start()
        assert inside["t4 t5"].wait(10)
        threads[1].start()
        assert inside["t1 t2 t3"].wait(10)
        go.set()
        for t in threads:
            t.join(10)
        assert len(made) == 2 and store.scheduler.stats.prefills == 1 and time.perf_counter() - t0 < 4
        with pytest.raises(ServeError, match="max_new_tokens=99"):
            store.create("t6", wb.DDTree(3), max_new_tokens=99)  # refused on its way: it is not waited for
        t0 = time.perf_counter()
        store.create("t6", wb.DDTree(3), max_new_tokens=4)
        assert store.scheduler.stats.prefills == 2 and time.perf_counter() - t0 < 2.5
    finally:
        store.drop_all()
        store.close()


def test_a_session_is_arriving_from_its_requests_head_on(eng):
    """The app says a session is arriving as soon as a POST /sessions head is in (its body still to come): a
    session opened meanwhile waits for it and both share one prefill; a request refused on its way holds
    nothing up."""
    import json
    import socket
    import time

    from workbench.engine.scheduler import BatchLimits
    from workbench.serve import EngineServer, Limits

    srv = EngineServer(eng, port=0, limits=Limits(max_sessions=4, max_new_tokens=8)).start()
    srv.store.release_memory = lambda: None  # (its full collection at the stop: 1 s of this test, not its point)
    sched = srv.store.scheduler
    sched.limits = BatchLimits(join_seconds=5.0)
    body = json.dumps({"prompt": "t1 t2 t3", "policy": "ddtree:3", "max_new_tokens": 4}).encode()
    head = (f"POST /sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {srv.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    try:
        sock = socket.create_connection((srv.host, srv.port), timeout=10)
        sock.sendall(head)
        for _ in range(500):  # (the scheduler's count of sessions on their way)
            if sched._arriving:
                break
            time.sleep(0.01)
        remote = wb.connect(srv.url, token=srv.token)
        other = threading.Thread(target=lambda: remote.session("t4 t5", policy=wb.DDTree(3), max_new_tokens=4))
        other.start()
        time.sleep(0.1)
        sock.sendall(body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 201")
        other.join(10)
        assert sched.stats.prefills == 1  # the two, together
        sock.sendall(head + b"{bad json" + b" " * (len(body) - 9))
        assert sock.recv(65536).startswith(b"HTTP/1.1 422")
        t0 = time.perf_counter()
        remote.session("t6", policy=wb.DDTree(3), max_new_tokens=4)
        assert sched.stats.prefills == 2 and time.perf_counter() - t0 < 2.5  # the refused one is not waited for
        sock.close()
    finally:
        srv.stop()
