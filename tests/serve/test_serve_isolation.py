"""Isolation of served sessions: changing any setting of one session leaves every other session's settings,
and its next cycles, exactly as a solo run's.

Three live sessions with different settings are stepped in turn on one server; between cycles, one of them
gets every setting the wire can carry changed, one PATCH at a time. Each PATCH is either applied (the
session's state shows the new value, and a local reference session gets the same change) or refused (then
nothing changes anywhere). After each one, the other sessions' settings are read back by value; at the
end every session's cycles must equal its local reference's, cycle for cycle.
"""
from __future__ import annotations


import pytest
import torch

import workbench as wb
from shared_checks import http_call as call
from shared_checks import same_cycle
from workbench.serve import wire


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models on one thread


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    from tiny_models import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("iso"), vocab=40, hidden=32, layers=3, layer_ids=(0, 2), block_size=6,
                     seed=8, eos=False)
    return wb.load(target=t, draft=d)


@pytest.fixture(scope="module")
def server(eng):
    from workbench.serve import EngineServer, Limits

    srv = EngineServer(eng, port=0, limits=Limits(max_sessions=8, max_new_tokens=64, max_budget=48)).start()
    yield srv
    srv.stop()


SESSIONS = {
    "a": dict(prompt="t1 t2 t3", policy=wb.DDTree(6), temperature=0.8, top_p=0.9, top_k=0, seed=1),
    "b": dict(prompt="t5 t9", policy=wb.DFlash(), temperature=0.0, top_p=1.0, top_k=0, seed=0),
    "c": dict(prompt="t7 t7 t8", policy=wb.DDTree(4), temperature=1.0, top_p=1.0, top_k=5, seed=2),
}
# Every setting the wire may carry in a PATCH, with a new value for session "a" (a local setter of the same name).
CHANGES = [("policy", wb.DFlash()), ("temperature", 0.4), ("top_p", 0.7), ("top_k", 3), ("seed", 9),
           ("max_new_tokens", 30), ("capture", True), ("capture", False)]
READ = ("policy", "temperature", "top_p", "top_k", "seed", "max_new_tokens", "record_topk", "capture", "kernel_backend")
MAX_NEW = 40


def settings_of(server, sid: str) -> dict:
    status, st = call(server, "GET", f"/sessions/{sid}?since=0&until=0")
    assert status == 200, st
    return {k: st[k] for k in READ} | {"n_cycles": st["n_cycles"]}


def wire_value(name, v):
    return wire.policy_to_wire(v) if name == "policy" else v


def strip(c: wb.Cycle, forwards: bool = True) -> dict:
    d = c.to_dict()
    d.pop("stage_seconds")
    if not forwards:
        d.pop("forwards")
    return d


def test_changing_one_sessions_settings_leaves_the_others_alone(eng, server):
    ids, local = {}, {}
    for name, kw in SESSIONS.items():
        kw = dict(kw)
        prompt = kw.pop("prompt")
        status, st = call(server, "POST", "/sessions", {"prompt": prompt, "policy": wire.policy_to_wire(kw["policy"]),
                                                      **{k: v for k, v in kw.items() if k != "policy"},
                                                      "max_new_tokens": MAX_NEW, "record_topk": 4})
        assert status == 201, st
        ids[name] = st["id"]
        local[name] = eng.session(prompt, max_new_tokens=MAX_NEW, record_topk=4, **kw)
    before = {name: settings_of(server, sid) for name, sid in ids.items()}
    for name, kw in SESSIONS.items():  # the state says what the session was made with, by value
        got = before[name]
        assert (got["temperature"], got["top_p"], got["top_k"], got["seed"]) == (kw["temperature"], kw["top_p"],
                                                                               kw["top_k"], kw["seed"])
        assert wire.policy_from_wire(got["policy"]) == kw["policy"] and got["record_topk"] == 4

    def step_all():
        for name, sid in ids.items():
            status, st = call(server, "POST", f"/sessions/{sid}/step", {"since": 0})
            assert status == 200, st
            local[name].step()

    step_all()
    before = {name: settings_of(server, sid) for name, sid in ids.items()}
    applied = []
    for field, value in CHANGES:
        status, reply = call(server, "PATCH", f"/sessions/{ids['a']}", {field: wire_value(field, value)})
        now = {name: settings_of(server, sid) for name, sid in ids.items()}
        if status == 200:
            applied.append(field)
            if field != "capture":
                setattr(local["a"], field, value)
            want = wire_value(field, value) if field != "capture" else value
            assert now["a"][field] == want, (field, now["a"][field])
            before["a"][field] = now["a"][field]
        else:  # refused: a clear error about that field, and nothing changed anywhere
            assert status == 422, reply
            assert field in reply.get("message", "") or reply.get("field") == field, reply
        for name in ("b", "c"):
            assert now[name] == before[name], f"PATCH {field} of session a changed session {name}"
        assert now["a"] == before["a"], f"PATCH {field} changed another setting of session a"
        if field == "temperature":
            step_all()  # a cycle between changes, so each change lands on a running session
            before = {name: settings_of(server, sid) for name, sid in ids.items()}
    assert {"policy", "temperature"} <= set(applied), f"the server applied only {applied}"
    step_all(), step_all()
    for name, sid in ids.items():
        status, st = call(server, "GET", f"/sessions/{sid}?since=0&records=full")  # every field of every cycle
        assert status == 200
        got = wire.cycles_from_wire(st["cycles"])
        ref = local[name].cycles
        assert len(got) == len(ref) == 4, (name, len(got), len(ref))
        # Session a's capture (if applied) adds module records to its forwards; its results must still match.
        assert [strip(c, name != "a") for c in got] == [strip(c, name != "a") for c in ref], name
        assert st["generated"] == local[name].generated
        assert wire.trace_from_wire(st["trace"]).meta == local[name].trace.meta
    for sid in ids.values():
        call(server, "DELETE", f"/sessions/{sid}")


def test_concurrent_clients_with_setting_changes_match_solo_runs(eng, server):
    """Four clients in threads, each changing its own session's policy and temperature between cycles: every
    session's cycles equal a solo run that made the same changes at the same cycles."""
    import threading

    plans = [(f"t{3 + i} t{10 + i}", wb.DDTree(4 + i), 0.5 * i, [("policy", wb.DFlash()), ("temperature", 0.2 * i)])
             for i in range(4)]

    def drive(s, changes):
        s.step()
        for k, v in changes:
            setattr(s, k, v)
        s.step()
        s.step()

    solo = []
    for prompt, pol, temp, changes in plans:
        s = eng.session(prompt, policy=pol, temperature=temp, seed=5, max_new_tokens=MAX_NEW)
        drive(s, changes)
        solo.append(s)
    remote = wb.connect(server.url, token=server.token)
    results, errors = [None] * 4, []

    def client(i):
        try:
            prompt, pol, temp, changes = plans[i]
            s = remote.session(prompt, policy=pol, temperature=temp, seed=5, max_new_tokens=MAX_NEW)
            drive(s, changes)
            results[i] = s
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for i, (rs, ref) in enumerate(zip(results, solo)):
        assert len(rs.cycles) == len(ref.cycles), i
        for a, b in zip(rs.cycles, ref.cycles):  # batched with the other clients: float32 rounding
            same_cycle(a, b)
        assert (rs.policy, rs.temperature) == (wb.DFlash(), 0.2 * i)
        rs.close()


def test_a_busy_session_never_expires_and_an_idle_one_does(eng):
    """The store's expiry, on a clock of our own: a session in use (or waited for) outlives the TTL; once
    released and idle past it, it is dropped, and only it."""
    from workbench.serve.store import Limits, SessionStore

    now = [0.0]
    store = SessionStore(eng, Limits(max_sessions=4, max_new_tokens=16, session_ttl=10.0), clock=lambda: now[0])
    a = store.create("t1 t2", wb.DDTree(4), max_new_tokens=8)
    b = store.create("t3", wb.DFlash(), max_new_tokens=8)
    with store.use(a.id):
        now[0] = 25.0
        assert store.expire() == [b.id], "the idle session expires, the busy one does not"
        assert [e.id for e in store.entries()] == [a.id]
    assert store.expire() == []  # just released: its idle time starts now
    now[0] = 36.0
    assert store.expire() == [a.id] and len(store) == 0


def test_freed_memory_goes_back_only_when_no_request_runs(eng, monkeypatch):
    """The sweeper hands dropped sessions' memory back (a full collection, which stops the process) only
    once no session is in use and none has been for QUIET_SECONDS; a sweep while another is in use waits."""
    from workbench.serve.store import QUIET_SECONDS, Limits, SessionStore

    now = [0.0]
    store = SessionStore(eng, Limits(max_sessions=4, max_new_tokens=16, session_ttl=100.0), clock=lambda: now[0])
    released = []
    monkeypatch.setattr(store, "release_memory", lambda: released.append(now[0]))
    a = store.create("t1 t2", wb.DDTree(4), max_new_tokens=8)
    b = store.create("t3", wb.DFlash(), max_new_tokens=8)
    now[0] = 5.0
    assert not store.sweep_once() and released == []  # nothing dropped yet
    store.delete(b.id)
    with store.use(a.id):
        now[0] = 50.0
        assert not store.quiet() and not store.sweep_once()  # a request runs
    assert not store.sweep_once()  # it has just ended
    now[0] += QUIET_SECONDS
    assert store.quiet() and store.sweep_once() and released == [now[0]]
    assert not store.sweep_once()  # once per batch of drops
    now[0] = 200.0  # a's TTL passes: the sweep drops it and, quiet, returns its memory too
    assert store.sweep_once() and len(store) == 0 and released == [51.0, 200.0]
