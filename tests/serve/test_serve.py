"""The served engine (python -m workbench serve) and its client (wb.connect), on loopback only.

A served session must give exactly what a local session on the same engine gives; the
server must refuse what it should, with the limit or field named, and never fall over.
"""
from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

import workbench as wb
from shared_checks import http_call as raw
from shared_checks import same_cycle
from workbench.serve import client as remote_mod
from workbench.records import tensor_codec
from workbench.serve import wire
from workbench.__main__ import main
from workbench.serve import EngineServer, Limits
from workbench.interface.base import BaseEngine, BaseSession, EngineLacks
from workbench.serve.main import read_or_make_token

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def parse(line):\n    "
LIMITS = Limits(max_sessions=6, max_new_tokens=64, max_budget=48, session_ttl=120.0)


def strip(c: wb.Cycle) -> dict:
    """A cycle's record without its timings (the only field two runs may differ in)."""
    d = c.to_dict()
    d.pop("stage_seconds")
    return d


def fig_data(fig) -> list[dict]:
    """A figure's traces without plotly's random uids."""
    return [{k: v for k, v in tr.items() if k != "uid"} for tr in fig.to_dict()["data"]]


def assert_same_trace(a: wb.Trace, b: wb.Trace) -> None:
    assert [strip(c) for c in a.cycles] == [strip(c) for c in b.cycles]
    assert (a.meta, a.prefill, a.finish_reason, a.new_tokens) == (b.meta, b.prefill, b.finish_reason, b.new_tokens)


@pytest.fixture(scope="module")
def cli_server(tmp_path_factory):
    """`python -m workbench serve` in a subprocess, started first so it loads while other tests run."""
    tok = tmp_path_factory.mktemp("serve") / "token"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "serve", "--port", "0", "--token-file", str(tok), "--threads", "1",
         "--session-ttl", "60"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield proc, tok
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _start_cli_early(cli_server):
    yield


@pytest.fixture(scope="module")
def server(engine):
    s = EngineServer(engine, port=0, limits=LIMITS).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def remote(server):
    return wb.connect(server.url, token=server.token)


TOKEN = "t" * 40  # a token long enough for the server (32 characters at least)


# ------------------------------------------------------------------------------ same results as in-process
@pytest.mark.parametrize("policy,temperature", [(wb.AR(), 0.0), (wb.DFlash(), 0.0), (wb.DDTree(16), 0.0),
                                                (wb.DDTree(8), 0.8)], ids=["ar", "dflash", "ddtree", "ddtree-T0.8"])
def test_round_trip_equals_in_process(engine, remote, policy, temperature):
    kw = dict(policy=policy, temperature=temperature, seed=3, max_new_tokens=12)
    local = engine.session(PROMPT, **kw)
    rs = remote.session(PROMPT, **kw)
    c_local, c_remote = local.step(), rs.step()
    assert isinstance(c_remote, wb.Cycle) and strip(c_remote) == strip(c_local)
    lt, rt = local.run(), rs.run()
    assert isinstance(rt, wb.Trace)
    assert_same_trace(lt, rt)
    assert (rs.text, rs.tokens, rs.full_text, rs.finished) == (local.text, local.tokens, local.full_text, True)
    assert (rs.start, rs.bonus, rs.prompt_ids) == (local.start, local.bonus, local.prompt_ids)
    assert [tuple(k.shape) for k, _ in rs.kv_cache()] == [tuple(k.shape) for k, _ in local.kv_cache()]
    assert rt.summary().tau == lt.summary().tau
    rs.close()


def test_settings_between_cycles_and_run_limit(engine, remote):
    local = engine.session(PROMPT, policy=wb.AR(), max_new_tokens=8)
    rs = remote.session(PROMPT, policy=wb.AR(), max_new_tokens=8)
    for s in (local, rs):
        s.step()
        s.policy = wb.DDTree(12)
        s.temperature = 0.5
        s.step()
        s.policy = "dflash"
        s.run(max_new_tokens=16)  # a larger limit lets a finished session go on
    assert rs.policy == wb.DFlash() and rs.temperature == 0.5
    assert_same_trace(local.trace, rs.trace)
    with pytest.raises(ValueError, match="temperature"):
        rs.temperature = -1.0
    with pytest.raises(wb.SessionFinished, match="finished"):
        rs.step()
    rs.close()


def test_views_stepper_and_shapes_on_a_remote_session(engine, remote):
    local = engine.session(PROMPT, policy=wb.DDTree(10), max_new_tokens=12)
    rs = remote.session(PROMPT, policy=wb.DDTree(10), max_new_tokens=12)
    st_l, st_r = wb.Stepper(local), wb.Stepper(rs)
    assert strip(st_r.step()) == strip(st_l.step())
    st_l.run(2), st_r.run(2)
    assert st_r.shown_cycle == st_l.shown_cycle == 2
    assert fig_data(st_r.tree) == fig_data(st_l.tree)
    assert fig_data(st_r.stream) == fig_data(st_l.stream)
    fig_l = wb.views.tree_figure(local.cycles[1], engine.tokenizer)
    fig_r = wb.views.tree_figure(rs.cycles[1], remote.tokenizer)
    assert fig_data(fig_r) == fig_data(fig_l)
    assert str(wb.shapes.table(rs)) == str(wb.shapes.table(local))
    checks = wb.shapes.check_contracts(rs)
    assert checks.passed and str(checks) == str(wb.shapes.check_contracts(local))
    # Reset makes a new remote session with the stepper's settings; finishing shows the error in the widget.
    st_r.policy_kind.value = "dflash"
    fresh = st_r.reset()
    assert isinstance(fresh, wb.RemoteSession) and fresh.id != rs.id and fresh.policy == wb.DFlash()
    st_r.run(100)
    assert fresh.finished and st_r.step() is None and "finished" in st_r.status.value
    rs.close(), fresh.close()


def test_shape_capture_on_the_server(engine, remote):
    local = engine.session(PROMPT, policy=wb.DDTree(6), max_new_tokens=8)
    with wb.shapes.capture(local):
        local.step()
    rs = remote.session(PROMPT, policy=wb.DDTree(6), max_new_tokens=8)
    rs.capture = True
    rs.step()
    rs.capture = False
    assert rs.capture is None
    assert any(r.modules for r in rs.cycles[0].forwards)
    assert str(wb.shapes.table(rs, mode="TARGET_VERIFY")) == str(wb.shapes.table(local, mode="TARGET_VERIFY"))
    rs.close()


def test_reattach_by_id_after_a_restart(remote, server):
    rs = remote.session(PROMPT, policy=wb.DDTree(8), max_new_tokens=16)
    rs.step(), rs.step()
    again = wb.connect(server.url, token=server.token).session_by_id(rs.id)  # a new kernel, the same session
    assert_same_trace(again.trace, rs.trace)
    assert (again.text, again.policy) == (rs.text, rs.policy)
    again.step()
    assert len(rs.refresh().cycles) == 3 and strip(rs.cycles[2]) == strip(again.cycles[2])
    assert rs.id in {s["id"] for s in remote.sessions()}
    rs.close()
    with pytest.raises(wb.remote.UnknownSession, match="was deleted"):
        again.step()


def test_wire_objects_round_trip(engine):
    import dataclasses

    import torch

    for p in (wb.AR(), wb.DFlash(), wb.DDTree(32), wb.DDTree(8, width=2), wb.EagleTree(2, 3, 6)):
        assert wire.policy_from_wire(wire.loads(wire.dumps(wire.policy_to_wire(p)))) == p
    assert wire.policy_from_wire("ddtree:12") == wb.DDTree(12)
    assert wire.policy_from_wire("eagle:2:3:6") == wb.EagleTree(2, 3, 6)  # the server takes it; the client decodes it
    with pytest.raises(ValueError, match="cannot be served"):
        wire.policy_to_wire(wb.TreePolicy(lambda lp, roots, budget: None))
    for bad, msg in [({"name": "beam"}, "unknown policy name"), ({"name": "ar", "budget": 3}, "no field"),
                     (7, "must be a string")]:
        with pytest.raises(ValueError, match=msg):
            wire.policy_from_wire(bad)
    s = engine.session(PROMPT, policy=wb.DDTree(4), max_new_tokens=4)
    c = s.step()
    lp = c.draft_topk_logprobs.clone()
    lp[0, -1] = float("-inf")  # a log-prob of an impossible token must survive the wire
    c = dataclasses.replace(c, draft_topk_logprobs=lp)
    (back,) = wire.cycles_from_wire(wire.loads(wire.dumps(wire.cycles_to_wire([c]))))
    assert torch.equal(back.draft_topk_logprobs, lp) and back.to_dict() == c.to_dict()
    assert "visibility" not in wire.cycle_to_wire(c)  # rebuilt from parents on arrival
    (old,) = wire.cycles_from_wire(wire.loads(wire.dumps([c.to_dict()])))  # version 1's records still read
    assert old.to_dict() == c.to_dict()
    # A mask that is not the tree's ancestor matrix travels as it is (bit-packed), never silently replaced.
    vis = c.visibility.clone()
    vis[-1, 0] = False
    odd = dataclasses.replace(c, visibility=vis)
    (back,) = wire.cycles_from_wire(wire.loads(wire.dumps(wire.cycles_to_wire([odd]))))
    assert torch.equal(back.visibility, vis)
    g = torch.Generator().manual_seed(0)
    for t in (torch.randint(-2**40, 2**40, (3, 5), generator=g), torch.randint(0, 200, (7,), generator=g),
              torch.randn(4, 3, generator=g), torch.tensor([float("nan"), -0.0, float("inf")]),
              torch.zeros(0, 8, dtype=torch.long), torch.rand(5, 5, generator=g) > 0.5):
        back = tensor_codec.unpack_tensor(wire.loads(wire.dumps(tensor_codec.pack_tensor(t))))
        assert back.dtype == t.dtype and back.shape == t.shape
        bits = (lambda x: x.reshape(-1).view(torch.uint8)) if t.is_floating_point() else (lambda x: x)
        assert torch.equal(bits(back), bits(t))  # bit for bit: NaN, -0.0 and inf included
    head = wire.trace_from_wire(wire.loads(wire.dumps(wire.trace_head_to_wire(s.trace))))
    assert (head.meta, head.prefill, head.prefill_seconds, head.new_tokens) == \
        (s.trace.meta, s.trace.prefill, s.trace.prefill_seconds, s.trace.new_tokens)


# ------------------------------------------------------------------------------ refusals
def test_token_is_required_on_every_request(server):
    for path in ("/health", "/info", "/sessions", "/tokenizer"):
        status, body = raw(server, "GET", path, token=None)
        assert (status, body["error"]) == (401, "unauthorized") and "missing token" in body["message"]
        status, body = raw(server, "GET", path, token=server.token + "x")
        assert (status, body["error"]) == (401, "unauthorized") and "wrong token" in body["message"]
    status, _ = raw(server, "POST", "/sessions", {"prompt": "x"}, token="nope-nope")
    assert status == 401
    with pytest.raises(wb.remote.Unauthorized, match="wrong token"):
        wb.connect(server.url, token="not-the-token")
    with pytest.raises(ValueError, match="no token"):
        wb.connect(server.url, token="")


def test_limits_are_refused_with_their_name(remote, server):
    with pytest.raises(wb.remote.LimitExceeded, match="max_budget=48") as e:
        remote.session(PROMPT, policy=wb.DDTree(49))
    assert (e.value.status, e.value.limit, e.value.field) == (422, "max_budget", "policy.budget")
    with pytest.raises(wb.remote.LimitExceeded, match="max_new_tokens=64") as e:
        remote.session(PROMPT, max_new_tokens=65)
    assert e.value.limit == "max_new_tokens"
    rs = remote.session(PROMPT, policy=wb.AR(), max_new_tokens=2)
    with pytest.raises(wb.remote.LimitExceeded, match="max_budget"):
        rs.policy = wb.DDTree(100)
    with pytest.raises(wb.remote.LimitExceeded, match="max_new_tokens"):
        rs.run(max_new_tokens=1000)
    assert rs.policy == wb.AR()
    others = [remote.session("x", policy=wb.AR(), max_new_tokens=2) for _ in range(LIMITS.max_sessions - 1)]
    with pytest.raises(wb.remote.LimitExceeded, match="max_sessions=6") as e:
        remote.session("x", max_new_tokens=2)
    assert (e.value.status, e.value.limit) == (429, "max_sessions")
    for s in [rs, *others]:
        s.close()
    assert remote.health()["sessions"] == 0


@pytest.mark.parametrize("body,field", [
    ({"prompt": 5}, "prompt"), ({}, "prompt"), ({"prompt": "x", "top_p": 2.0}, "top_p"),
    ({"prompt": "x", "max_new_tokens": 1.5}, "max_new_tokens"), ({"prompt": "x", "max_new_tokens": True}, "max_new_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"), ({"prompt": "x", "colour": 1}, "colour"),
    ({"prompt": "x", "policy": "beam:3"}, "policy"), ({"prompt": "x", "policy": {"name": "ddtree", "budget": 0}}, "policy"),
    ({"prompt": ""}, "prompt"), ({"prompt": "x", "kernel_backend": "nope"}, "kernel_backend"),
    (b"{not json", "body"), ([1, 2], "body"), (b'{"prompt": "x", "seed": ' + b"7" * 5000 + b"}", "body"),
    (b'{"prompt": "\\ud800 lone"}', "prompt"), (b"\xff\xfe not utf-8", "body"), ({"prompt": "x", "seed": 2**70}, "seed"),
    ({"prompt": "x", "top_k": 10**30}, "top_k"), ({"prompt": "x", "policy": "p" * 100_000}, "policy"),
    ({"prompt": "x", "policy": {"name": "q" * 100_000}}, "policy"),
])
def test_malformed_requests_are_422_naming_the_field(server, body, field):
    status, reply = raw(server, "POST", "/sessions", body)
    assert status == 422, reply
    assert reply["error"] == "invalid" and reply["field"] == field, reply
    assert field in reply["message"] or field == "body"
    assert set(reply) <= {"error", "message", "field", "limit"} and len(reply["message"]) < 400, reply


@pytest.mark.parametrize("method,path,status,code", [
    ("GET", "/nowhere", 404, "not_found"), ("GET", "/" + "x" * 5000, 404, "not_found"),
    ("PUT", "/health", 405, "method_not_allowed"), ("GET", "/sessions/abc?since=" + "9" * 5000, 422, "invalid"),
    ("GET", "/sessions/abc?since=zz", 422, "invalid"),
])
def test_every_refusal_has_the_documented_shape(server, method, path, status, code):
    got, reply = raw(server, method, path)
    assert (got, reply["error"]) == (status, code), reply
    assert set(reply) <= {"error", "message", "field", "limit"} and len(reply["message"]) < 400, reply


def test_unknown_session_and_bad_steps(server, remote):
    for method, path, body in [("GET", "/sessions/deadbeef", None), ("POST", "/sessions/deadbeef/step", {}),
                               ("PATCH", "/sessions/deadbeef", {}), ("DELETE", "/sessions/deadbeef", None)]:
        status, reply = raw(server, method, path, body)
        assert (status, reply["error"]) == (404, "unknown_session") and "deadbeef" in reply["message"]
    with pytest.raises(wb.remote.UnknownSession):
        remote.session_by_id("deadbeef")
    with pytest.raises(ValueError, match="not a session id"):
        remote.session_by_id("../info")
    rs = remote.session(PROMPT, policy=wb.AR(), max_new_tokens=3)
    status, reply = raw(server, "POST", f"/sessions/{rs.id}/step", {"since": -1})
    assert (status, reply["field"]) == (422, "since")
    status, reply = raw(server, "POST", f"/sessions/{rs.id}/run", {"max_new_tokens": 0})
    assert (status, reply["field"]) == (422, "max_new_tokens")
    rs.run()
    status, reply = raw(server, "POST", f"/sessions/{rs.id}/step", {})
    assert (status, reply["error"]) == (409, "session_finished")
    assert remote.health()["status"] == "ok"  # still serving after all of the above
    rs.close()


def test_a_server_bug_is_a_500_and_the_server_goes_on(server, remote, monkeypatch):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(server.store, "kv_bytes", broken)
    status, reply = raw(server, "GET", "/health")
    assert (status, reply["error"]) == (500, "internal") and "boom" not in reply["message"]
    monkeypatch.undo()
    assert remote.health()["status"] == "ok"


def test_stopping_refuses_new_cycles_and_drops_sessions(engine):
    srv = EngineServer(engine, port=0).start()
    r = wb.connect(srv.url, token=srv.token)
    s = r.session(PROMPT, policy=wb.AR(), max_new_tokens=4)
    ref = weakref.ref(srv.store.entries()[0].session)
    srv.store.stopping.set()  # what a signal does first: running runs end at their next cycle
    with pytest.raises(wb.remote.RemoteError, match="shutting down") as e:
        s.step()
    assert (e.value.status, e.value.code) == (503, "stopping")
    srv.stop()
    assert not srv._thread.is_alive() and len(srv.store) == 0
    gc.collect()
    assert ref() is None
    with pytest.raises(ConnectionError, match="cannot reach"):
        s.step()


def test_wire_version_mismatch_names_both_versions(server, monkeypatch):
    status, reply = raw(server, "GET", "/info", headers={wire.VERSION_HEADER: "99"})
    assert (status, reply["error"]) == (400, "wire_version")
    assert f"client speaks version 99, the server speaks version {wire.WIRE_VERSION}" in reply["message"]
    monkeypatch.setattr(remote_mod, "WIRE_VERSION", wire.WIRE_VERSION + 1)
    with pytest.raises(wb.remote.WireVersionError, match=f"version {wire.WIRE_VERSION + 1}.*version {wire.WIRE_VERSION}"):
        wb.connect(server.url, token=server.token)


def test_info_and_health(remote, server, engine):
    info = remote.info
    assert info["wire_version"] == wire.WIRE_VERSION and info["limits"] == LIMITS.to_dict()
    assert (info["device"], info["dtype"]) == ("cpu", "float32")
    assert info["models"]["block_size"] == engine.models.block_size
    assert {"workbench", "torch", "transformers", "python", "wire"} <= set(info["versions"])
    assert remote.device.type == "cpu" and "RemoteEngine" in repr(remote)


# ------------------------------------------------------------------------------ many clients at once
LOAD = [(p, pol) for p in ("def parse(line):\n    ", "class Stack:\n    ", "import os\n", "for i in range(")
        for pol in (wb.DDTree(16), wb.DFlash())]


def test_eight_concurrent_clients_no_crosstalk_and_memory_returned(engine):
    import psutil

    assert len(LOAD) == 8
    solo = [engine.session(p, policy=pol, max_new_tokens=8) for p, pol in LOAD]
    for s in solo:
        s.run()
    srv = EngineServer(engine, port=0, limits=Limits(max_sessions=8, max_new_tokens=64, session_ttl=2.0)).start()
    refs = []
    create = srv.store.create

    def create_and_watch(*a, **kw):
        e = create(*a, **kw)
        refs.append(weakref.ref(e.session))
        return e

    srv.store.create = create_and_watch
    rss0 = psutil.Process().memory_info().rss
    results, errors, lat = [None] * 8, [], []
    deadline = time.monotonic() + 15.0  # bounded: clients stop stepping here even if unfinished

    def client(i):
        try:
            r = wb.connect(srv.url, token=srv.token)
            s = r.session(LOAD[i][0], policy=LOAD[i][1], max_new_tokens=8)
            while not s.finished and time.monotonic() < deadline:
                t = time.perf_counter()
                s.step()
                lat.append(time.perf_counter() - t)
            results[i] = s
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {type(e).__name__}: {e}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    wall = time.perf_counter() - t0
    try:
        assert not errors, errors
        for s, ref in zip(results, solo):
            n = len(s.cycles)
            assert n > 0
            for a, b in zip(s.cycles, ref.cycles[:n]):  # batched with the other clients: float32 rounding
                same_cycle(a, b)
            assert s.tokens == ref.tokens[:len(s.tokens)] and (not s.finished or s.text == ref.text)
        lat.sort()
        print(f"\nload: 8 clients, {len(lat)} steps in {wall:.2f} s = {len(lat) / wall:.1f} steps/s; step latency "
              f"median {1e3 * lat[len(lat) // 2]:.0f} ms, p90 {1e3 * lat[int(len(lat) * 0.9)]:.0f} ms, "
              f"max {1e3 * lat[-1]:.0f} ms; all finished: {all(s.finished for s in results)}")
        for _ in range(200):  # the sweeper runs every ttl / 4
            if srv.store.kv_bytes() == 0 and len(srv.store) == 0:
                break
            time.sleep(0.05)
        health = wb.connect(srv.url, token=srv.token).health()
        assert (health["sessions"], health["session_kv_bytes"]) == (0, 0)
        with pytest.raises(wb.remote.UnknownSession, match="expired after 2 s idle"):
            results[0].step()
        gc.collect()
        assert len(refs) == 8 and all(r() is None for r in refs), "an expired session is still referenced"
        grown = psutil.Process().memory_info().rss - rss0
        print(f"memory: RSS {rss0 / 2**20:.0f} MiB before, {grown / 2**20:+.1f} MiB after the 8 sessions expired "
              f"(/health: {health['rss_bytes'] / 2**20:.0f} MiB resident)")
        assert grown < 256 * 2**20
    finally:
        srv.stop()


# ------------------------------------------------------------------------------ the command
def test_cli_serve_drains_on_sigterm(cli_server):
    """SIGTERM during a /run: the run stops at its next cycle and its cycles come back with the 503; exit 0."""
    proc, tok = cli_server
    url = None
    t0 = time.monotonic()
    lines = []
    while time.monotonic() - t0 < 120 and url is None:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        url = m.group(1) if m else None
    assert url, f"no 'listening on' line: {lines} {proc.stderr.read() if proc.poll() is not None else ''}"
    assert url.startswith("http://127.0.0.1:")
    r = wb.connect(url, token_file=tok)
    s = r.session(PROMPT, policy=wb.AR(), max_new_tokens=1000)
    box = []

    def run():
        try:
            s.run()
        except wb.remote.RemoteError as e:
            box.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    while time.monotonic() - t0 < 120 and not r.sessions()[0]["n_cycles"] >= 3:  # the listing never waits on a run
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    runner.join(30)
    proc.wait(timeout=30)
    out, err = proc.stdout.read(), proc.stderr.read()  # not communicate(): it skips readline's buffer
    text = "".join(lines) + out
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Traceback" not in text
    assert f"stopped (SIGTERM); dropped 1 live session(s): {s.id}" in err
    (e,) = box
    assert (e.status, e.code) == (503, "stopping") and "stopped after" in str(e)
    held = s._trace.cycles  # what the 503 brought (reading s.trace would ask the stopped server for more)
    assert 3 <= len(held) == s._n_cycles < 1000 and [c.index for c in held] == list(range(len(held)))
    assert [c.root_token for c in held] == s.generated[:len(held)]  # each cycle starts from the last one's bonus
    # The token went to the file, readable by its owner only, and nowhere else.
    assert f"token (generated, written to {tok})" in text and tok.read_text().strip() not in text + err
    assert f"attach with wb.connect({url!r}, token_file={str(tok)!r})" in text  # not token=: it was not printed
    assert oct(tok.stat().st_mode & 0o777) == "0o600"


def test_serve_warns_off_loopback_and_checks_its_arguments(capsys, tmp_path):
    rc = main(["serve", "--host", "0.0.0.0", "--target", str(tmp_path / "none"), "--draft", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert rc == 2 and "WARNING: binding 0.0.0.0" in err and "is not a directory" in err
    rc = main(["serve", "--session-ttl", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--session-ttl 0.0 must be a positive" in err and "Traceback" not in err
    rc = main(["serve", "--header-timeout", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "header_timeout=0.0 must be a positive" in err
    assert wire.is_loopback("127.0.0.1") and wire.is_loopback("::1") and wire.is_loopback("localhost")
    assert not wire.is_loopback("0.0.0.0") and not wire.is_loopback("10.1.2.3")
    made = tmp_path / "sub" / "tok"
    token, origin = read_or_make_token(str(made))
    assert made.read_text().strip() == token and "written to" in origin and len(token) >= 32
    assert read_or_make_token(str(made)) == (token, f"read from {made}")


def test_token_files_others_can_read_or_plant_are_refused(tmp_path, monkeypatch, engine):
    good = tmp_path / "tok"
    good.write_text(TOKEN + "\n")
    good.chmod(0o600)
    assert read_or_make_token(str(good)) == (TOKEN, f"read from {good}")
    for mode in (0o644, 0o660, 0o606, 0o666):
        good.chmod(mode)
        with pytest.raises(ValueError, match=f"mode {mode:04o}: group or others.*chmod 600 {good}"):
            read_or_make_token(str(good))
    good.chmod(0o600)
    # Owned by another user: simulated by this process claiming another uid (making such a file needs root
    # and a second account; the check compares the file's owner with os.getuid(), so this is the same test).
    me = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me + 1)
    with pytest.raises(ValueError, match=f"owned by uid {me}, not by you \\(uid {me + 1}\\)"):
        read_or_make_token(str(good))
    monkeypatch.undo()
    short = tmp_path / "short"
    short.write_text("eight-ch\n")
    short.chmod(0o600)
    with pytest.raises(ValueError, match="at least 32 characters.*got 8 characters"):
        read_or_make_token(str(short))
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(ValueError, match="not a symlink"):
        read_or_make_token(str(link))
    with pytest.raises(ValueError, match="not a regular file"):
        read_or_make_token(str(tmp_path))
    for bad in ("short-token", " " + TOKEN, 12345):  # the Python API checks a token it is given the same way
        with pytest.raises(ValueError, match="at least 32 characters"):
            EngineServer(engine, token=bad)


# ------------------------------------------------------------------------------ the remote engine is the Engine
def _settings_script(eng):
    """Every setter of a session, between cycles, at temperature > 0 (so the seed matters)."""
    s = eng.session(PROMPT, policy=wb.DDTree(8), temperature=0.9, top_p=0.95, top_k=20, seed=5, max_new_tokens=10)
    s.step()
    s.top_k, s.top_p, s.seed = 1, 0.5, 3
    s.step()
    s.temperature, s.policy, s.top_k = 0.7, wb.DFlash(), 0
    s.seed = 3  # the same seed again: the sampler starts over
    s.step()
    s.max_new_tokens = 14
    s.run()
    return s


def test_one_script_of_settings_gives_the_same_records_locally_and_remotely(engine, remote, server):
    import torch

    mine = torch.get_num_threads()
    torch.set_num_threads(server.store.threads)  # the server computes with its own; so does this thread, here
    try:
        local, rs = _settings_script(engine), _settings_script(remote)
    finally:
        torch.set_num_threads(mine)
    got = lambda s: (s.temperature, s.top_p, s.top_k, s.seed, s.max_new_tokens, str(s.policy))  # noqa: E731
    assert got(rs) == got(local) == (0.7, 0.5, 0, 3, 14, "DFlash")
    assert_same_trace(local.trace, rs.trace)  # every cycle field by field (not the timings), and the whole header
    assert [c.setting for c in rs.trace] == [c.setting for c in local.trace]
    assert rs.trace.changes() == local.trace.changes() and {"cycle": 1, "name": "top_k", "value": 1} in rs.trace.changes()
    # prompt_ids= and static_shapes= travel; a trace replays itself on either side
    for kw in (dict(prompt_ids=local.prompt_ids), dict(prompt=PROMPT, static_shapes=True)):
        a = engine.session(**kw, policy=wb.DDTree(8), max_new_tokens=6)
        b = remote.session(**kw, policy=wb.DDTree(8), max_new_tokens=6)
        a.run(), b.run()
        assert_same_trace(a.trace, b.trace)
        b.close()
    assert engine.replay(rs.trace).generated == rs.generated
    again = remote.replay(local.trace)
    assert again.generated == local.generated and again.trace.changes() == local.trace.changes()
    # messages= too: the same checks and the same one line (this tokenizer has no chat template)
    for bad, why in (([{"role": "user", "content": None}], r"messages\[0\]\['content'\]=None is not text"),
                     ([{"role": "user", "content": "hi"}], "needs a chat template")):
        for eng in (engine, remote):
            with pytest.raises(ValueError, match=why):
                eng.session(messages=bad)
    with pytest.raises(ValueError, match=r"prompt_ids\[1\]=1.5 is not a token id"):
        remote.session(prompt_ids=[3, 1.5])
    # what a served session cannot change is refused in one line, not silently kept on this side
    with pytest.raises(AttributeError, match="fixed when a remote session starts"):
        rs.kernel_backend = "sglang"
    with pytest.raises(EngineLacks, match=r"^the served engine has no batch_session\(\): the server runs one"):
        remote.batch_session(["a", "b"])
    assert isinstance(remote, BaseEngine) and isinstance(rs, BaseSession)  # the engine interface, over HTTP
    with pytest.raises(EngineLacks, match=r"wb.connect\(url, token=...\)"):
        type(remote).load()
    with pytest.raises(ValueError, match="top_k"):
        rs.top_k = -1
    for s in (rs, again):
        s.close()

