"""Wire version 3's cheap steps: a run is one streamed request within its stated bounds, a step's
reply carries what changed and view records whose other fields come when read, and nothing of the server's
bounds is loosened (a stream nobody reads stops, then its connection is closed). Tiny models, loopback only."""
from __future__ import annotations

import http.client
import json
import re
import socket
import time

import pytest
import torch

import workbench as wb
from shared_checks import http_call as call
from shared_checks import same_cycle
from workbench.records import tensor_codec
from workbench.serve import wire

pytestmark = pytest.mark.usefixtures("one_thread")
TOKEN = "a-stream-test-token-of-forty-characters0"
MAX_NEW = 40


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    from tiny_models import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("stream"), vocab=40, hidden=32, layers=3, layer_ids=(0, 1),
                     block_size=6, seed=3, eos=False)
    return wb.load(target=t, draft=d)


def serve(eng, **limits):
    from workbench.serve import EngineServer, Limits

    return EngineServer(eng, port=0, token=TOKEN, limits=Limits(max_sessions=8, max_new_tokens=2000, **limits)).start()


@pytest.fixture(scope="module")
def server(eng):
    srv = serve(eng)
    yield srv
    srv.stop()


def local_run(eng, **kw):
    s = eng.session("t1 t2 t3", **{"policy": wb.DDTree(5), "max_new_tokens": MAX_NEW, **kw})
    s.run()
    return s


def count_calls(remote) -> list:
    """The client's requests, (method, path) each, as it makes them (JSON calls and streams alike)."""
    calls, http = [], remote._http

    class Counted:
        def __call__(self, method, path, body=None):
            calls.append((method, path))
            return http(method, path, body)

        def stream(self, method, path, body=None):
            calls.append((method, path))
            return http.stream(method, path, body)

    remote._http = Counted()
    return calls


def stream_lines(server, sid: str, body: dict) -> tuple[int, str, list[dict]]:
    """A /run by hand -> (status, content type, its lines as JSON)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", f"/sessions/{sid}/run", body=json.dumps(body),
                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    r = conn.getresponse()
    lines = [json.loads(x) for x in r.read().splitlines() if x.strip()]
    conn.close()
    return r.status, r.headers.get("content-type", ""), lines


# ------------------------------------------------------------------------------ a run is one streamed request
def test_a_run_is_one_request_that_streams_its_cycles(eng, server):
    remote = wb.connect(server.url, token=TOKEN)
    calls = count_calls(remote)
    s = remote.session("t1 t2 t3", policy=wb.DDTree(5), max_new_tokens=MAX_NEW, records="full")
    s.step()  # the stepper's single step: one request of its own
    s.run()
    assert [m for m, _ in calls] == ["POST", "POST", "POST"] and calls[2][1].endswith("/run"), calls
    ref = local_run(eng)
    assert s.tokens == ref.tokens and len(s.cycles) == len(ref.cycles) > 5
    for a, b in zip(s.cycles, ref.cycles):
        same_cycle(a, b)
    assert s.trace.meta == ref.trace.meta and s.text == ref.text and s.finish_reason == ref.finish_reason
    s.close()


def test_the_stream_by_hand_backlog_first_then_each_cycle_then_why_it_ended(server):
    status, st = call(server, "POST", "/sessions", {"prompt": "t1 t2 t3", "policy": "ddtree:5", "max_new_tokens": 12},
                      token=TOKEN)
    sid = st["id"]
    for _ in range(2):
        call(server, "POST", f"/sessions/{sid}/step", {"since": 0}, token=TOKEN)
    status, ctype, lines = stream_lines(server, sid, {"since": 0, "records": "full", "timing": True})
    assert status == 200 and ctype.startswith("application/x-ndjson")
    cycles, last = lines[:-1], lines[-1]
    assert [x["cycle"]["index"] for x in cycles] == list(range(len(cycles))) and len(cycles) > 2
    assert all("timing" in x for x in cycles[2:]) and all("timing" not in x for x in cycles[:2])  # backlog: no timing
    assert {"wait", "cycle", "record", "encode"} <= set(cycles[-1]["timing"])
    assert last["end"] == "finished" and last["state"]["n_cycles"] == len(cycles) and last["state"]["cycles"] == []
    assert last["state"]["finish_reason"].startswith("reached max_new_tokens")
    # a run of a finished session: nothing to make, its end at once
    status, _, lines = stream_lines(server, sid, {"since": len(cycles)})
    assert status == 200 and lines == [{"end": "finished", "state": lines[0]["state"]}]
    # refusals before a stream starts are plain error replies
    status, reply = call(server, "POST", f"/sessions/{sid}/run", {"max_new_tokens": 5000}, token=TOKEN)
    assert (status, reply["limit"]) == (422, "max_new_tokens")
    status, reply = call(server, "POST", f"/sessions/{sid}/run", {"records": "some"}, token=TOKEN)
    assert (status, reply["field"]) == (422, "records")
    call(server, "DELETE", f"/sessions/{sid}", token=TOKEN)


@pytest.mark.parametrize("limit,value,per_stream", [("max_stream_cycles", 3, 3), ("max_stream_bytes", 1, 1),
                                                     ("max_stream_seconds", 1e-6, 1)])
def test_every_stream_bound_ends_the_stream_and_the_client_carries_on(eng, limit, value, per_stream):
    srv = serve(eng, **{limit: value})
    try:
        status, st = call(srv, "POST", "/sessions", {"prompt": "t1 t2 t3", "policy": "ddtree:5",
                                                     "max_new_tokens": MAX_NEW}, token=TOKEN)
        status, _, lines = stream_lines(srv, st["id"], {"since": 0})
        assert status == 200 and len(lines) == per_stream + 1, lines[-1]
        assert lines[-1]["end"] == limit and lines[-1]["state"]["finish_reason"] is None
        remote = wb.connect(srv.url, token=TOKEN)
        streams = []
        stream = remote._http.stream
        remote._http.stream = lambda m, p, b=None: (streams.append(b), stream(m, p, b))[1]
        s = remote.session_by_id(st["id"], records="full")
        s.run()  # from the cycles it holds (none): the first stream's backlog, then on
        ref = local_run(eng)
        assert s.tokens == ref.tokens and len(s.cycles) == len(ref.cycles)
        for a, b in zip(s.cycles, ref.cycles):
            same_cycle(a, b)
        since = [b["since"] for b in streams]  # each stream goes on from what the client holds
        assert len(streams) >= 3 and since == sorted(set(since)) and since[0] == 0
    finally:
        srv.stop()


def test_a_stream_nobody_reads_stops_its_run_and_its_connection_is_closed(eng):
    srv = serve(eng, send_timeout=1.0)
    try:
        status, st = call(srv, "POST", "/sessions", {"prompt": "t1 t2 t3", "policy": "ddtree:20", "record_topk": 40,
                                                     "max_new_tokens": 2000}, token=TOKEN)
        sid = st["id"]
        # Small socket buffers at both ends (the server's connections inherit its listener's), so that what the
        # stream sends fills them within a few cycles, as a megabyte of records would on a default machine.
        srv.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes almost nothing
        sock.connect((srv.host, srv.port))
        body = json.dumps({"since": 0, "records": "full"}).encode()
        sock.sendall(f"POST /sessions/{sid}/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        entry = srv.store.entries()[0]
        deadline = time.monotonic() + 60
        while not entry.session.cycles and time.monotonic() < deadline:  # the run has started
            time.sleep(0.02)
        while entry.busy and time.monotonic() < deadline:  # the run stalls, then send_timeout aborts it
            time.sleep(0.05)
        made = len(entry.session.cycles)
        assert not entry.busy, "the unread stream still holds its session"
        assert 0 < made < 1000 and not entry.session.finished, made  # it stopped long before its 2000 tokens
        assert srv.guard.closed["send_timeout"] == 1
        print(f"\nan unread stream made {made} cycles before it stalled")
        time.sleep(0.3)
        assert len(entry.session.cycles) == made  # and stays stopped
        sock.close()
        remote = wb.connect(srv.url, token=TOKEN)
        s = remote.session_by_id(sid)
        s.step()  # the session goes on for a client that reads
        assert len(s.cycles) == made + 1
    finally:
        srv.stop()


# ------------------------------------------------------------------------------ what a step's reply carries
def test_a_steps_reply_carries_what_changed_and_a_setting_brings_the_full_state(server):
    status, st = call(server, "POST", "/sessions", {"prompt": "t1 t2 t3", "policy": "ddtree:5", "max_new_tokens": 20},
                      token=TOKEN)
    sid, rev, have, text = st["id"], st["revision"], len(st["generated"]), st["text"]
    assert "trace" in st and "prompt_ids" in st  # a new session's state is the full one
    status, step = call(server, "POST", f"/sessions/{sid}/step", {"since": 0, "have_tokens": have, "revision": rev},
                        token=TOKEN)
    assert status == 200 and not {"trace", "prompt", "prompt_ids", "kv_shapes", "policy"} & set(step)
    assert step["generated_from"] == have and len(step["generated"]) == step["cycles"][0]["committed"]
    assert step["cycles"][0]["view"] is True and "forwards" not in step["cycles"][0]
    full = call(server, "GET", f"/sessions/{sid}?since=0&until=0", token=TOKEN)[1]
    assert full["generated"] == st["generated"] + step["generated"]
    assert full["text"] == text[:step["text_from"]] + step["text"]
    status, patched = call(server, "PATCH", f"/sessions/{sid}", {"temperature": 0.5}, token=TOKEN)
    assert patched["revision"] > rev and "trace" in patched
    status, step = call(server, "POST", f"/sessions/{sid}/step",
                        {"since": 1, "have_tokens": len(full["generated"]), "revision": rev}, token=TOKEN)
    assert "trace" in step and step["generated_from"] == 0 and step["text_from"] == 0  # an old revision: all of it
    call(server, "DELETE", f"/sessions/{sid}", token=TOKEN)


def test_a_runs_last_line_carries_what_changed_and_a_new_limit_brings_the_full_state(server):
    """The last line of a /run holds the session's state as a step's reply would for the request's
    ``have_tokens`` and ``revision``: the tokens and text made since, without the full part; a run that sets
    ``max_new_tokens`` (a setting: the revision moves) or a client without the revision gets all of it."""
    status, st = call(server, "POST", "/sessions", {"prompt": "t1 t2 t3", "policy": "ddtree:5", "max_new_tokens": 6},
                      token=TOKEN)
    sid, rev, have = st["id"], st["revision"], len(st["generated"])
    status, _, lines = stream_lines(server, sid, {"since": 0, "have_tokens": have, "revision": rev})
    last = lines[-1]["state"]
    assert status == 200 and lines[-1]["end"] == "finished"
    assert not {"trace", "prompt", "prompt_ids", "kv_shapes", "policy"} & set(last)
    assert last["generated_from"] == have and st["generated"] + last["generated"] == \
        call(server, "GET", f"/sessions/{sid}", token=TOKEN)[1]["generated"]
    assert st["text"][:last["text_from"]] + last["text"] == call(server, "GET", f"/sessions/{sid}", token=TOKEN)[1]["text"]
    n = last["n_cycles"]
    status, _, lines = stream_lines(server, sid, {"since": n, "have_tokens": have + len(last["generated"]),
                                                  "revision": rev, "max_new_tokens": 12})
    again = lines[-1]["state"]
    assert again["revision"] > rev and "trace" in again and again["generated_from"] == 0  # the new limit: all of it
    assert again["new_tokens"] == 12 and [x["cycle"]["index"] for x in lines[:-1]] == list(range(n, again["n_cycles"]))
    status, _, lines = stream_lines(server, sid, {"since": again["n_cycles"]})  # holds nothing: the full state
    assert "trace" in lines[-1]["state"] and lines[-1]["state"]["generated"] == again["generated"]
    call(server, "DELETE", f"/sessions/{sid}", token=TOKEN)


def test_view_records_fetch_the_rest_when_read_and_only_then(eng, server):
    from workbench.serve.lazy_cycle import LazyCycle

    remote = wb.connect(server.url, token=TOKEN, timing=True)
    calls = count_calls(remote)
    s = remote.session("t1 t2 t3", policy=wb.DDTree(5), max_new_tokens=MAX_NEW)
    c0, c1, c2 = s.step(), s.step(), s.step()
    assert isinstance(c0, LazyCycle) and "forwards" in c0.missing() and "tokens" not in c0.missing()
    wb.views.tree_figure(c2), repr(c2), s.trace.summary()  # what the views read travelled: no request
    assert len(calls) == 4
    ref = eng.session("t1 t2 t3", policy=wb.DDTree(5), max_new_tokens=MAX_NEW)
    refs = [ref.step() for _ in range(3)]
    assert torch.equal(c1.draft_topk_logprobs, refs[1].draft_topk_logprobs)  # one request fills cycles 1 and 2
    assert len(calls) == 5 and "records=full" in calls[-1][1] and c1.missing() == [] and c2.missing() == []
    same_cycle(c2, refs[2])
    assert len(calls) == 5
    assert [t["index"] for t in s.timings] == [0, 1, 2] and {"round_trip", "decode", "wait", "http"} <= set(s.timings[0])
    s.close(fetch=False)
    with pytest.raises(wb.remote.UnknownSession, match="records='full'"):
        c0.forwards  # noqa: B018 - the session is gone: what was not read cannot come any more
    assert c0.tokens is not None  # what travelled stays
    s2 = remote.session("t1 t2", policy=wb.DDTree(5), max_new_tokens=10)
    s2.run()
    held = list(s2.cycles)
    before = len(calls)
    s2.close()  # one request: what was not read is not fetched unless asked for
    assert calls[before:] == [("DELETE", f"/sessions/{s2.id}")] and all(c.missing() for c in held)
    s3 = remote.session("t1 t2", policy=wb.DDTree(5), max_new_tokens=10)
    s3.run()
    held = list(s3.cycles)
    s3.close(fetch=True)  # asked: what was not read comes first, so the trace held stays whole
    assert all(c.missing() == [] for c in held)


def test_a_stream_that_breaks_off_says_whether_the_server_is_gone_and_what_is_held(server, monkeypatch):
    """A server killed mid-run breaks its stream off: the client's line says the server is gone (not that
    s.refresh() brings anything) and what it holds; s.tokens holds the tokens of every cycle that arrived.
    A server that still answers is told apart (s.refresh() then brings the rest)."""
    from workbench.serve.client import committed_tokens

    remote = wb.connect(server.url, token=TOKEN)
    s = remote.session("t1 t2 t3", policy=wb.DDTree(5), max_new_tokens=16)
    real = remote._http.stream

    def cut(method, path, body=None):
        for i, frame in enumerate(real(method, path, body)):
            if i == 3:
                raise ConnectionError(f"the workbench server at {server.url} broke off its stream: IncompleteRead")
            yield frame

    monkeypatch.setattr(remote._http, "stream", cut)
    with pytest.raises(ConnectionError, match=r"the server still answers: 3 cycle\(s\) .* s.refresh\(\) brings"):
        s.run()
    monkeypatch.setattr(remote._http, "answers", lambda timeout=2.0: False)
    with pytest.raises(ConnectionError, match=r"server at \S+ is gone: .*IncompleteRead.* 6 cycle\(s\) and "
                                              r"\d+ token\(s\) are held here .*start a new one") as e:
        s.run()
    assert "refresh" not in str(e.value)
    assert len(s.cycles) == 6 and len(s.tokens) == 1 + sum(c.committed for c in s.cycles) > 6
    theirs = wb.connect(server.url, token=TOKEN).session_by_id(s.id)
    assert theirs.tokens[:len(s.tokens)] == s.tokens  # the server's own tokens, in order
    theirs.run()
    assert [t for c in theirs.cycles for t in committed_tokens(c)] == theirs.tokens[1:]
    theirs.close()


def test_a_view_records_tensors_are_unpacked_when_first_read_and_a_bad_one_is_named(eng):
    """The tensors a view record carries stay in their wire form until read (a run nobody reads costs a parse per
    cycle): read, they equal the local record's, once unpacked they are plain attributes; a malformed form is
    refused on arrival, and bytes that do not unpack are named (cycle and field) when read."""
    from workbench.serve.lazy_cycle import RAW

    s = eng.session("t1 t2 t3", policy=wb.DDTree(5), max_new_tokens=12)
    c = s.step()
    d = wire.loads(wire.dumps(wire.cycle_to_wire(c, "view")))
    lazy = wire.cycle_from_wire(d, fetch=None)
    held = set(lazy.__dict__[RAW])
    assert {"tokens", "parents", "score", "accepted_tokens"} <= held and not held & set(lazy.__dict__)
    assert lazy.index == c.index and lazy.committed == c.committed and set(lazy.__dict__[RAW]) == held  # none unpacked
    assert torch.equal(lazy.tokens, c.tokens) and torch.equal(lazy.score, c.score)  # bit for bit (floats as bytes)
    assert "tokens" in lazy.__dict__ and "tokens" not in lazy.__dict__[RAW] and "tokens" not in lazy.missing()
    assert lazy.missing() == sorted(wire.VIEW_LEAVES_OUT & {f.name for f in wire.CYCLE_FIELDS})
    for field, bad, why in (("tokens", {**d["tokens"], "dtype": "int65"}, "unknown dtype 'int65'"),
                            ("parents", {**d["parents"], "shape": [-1]}, "shape [-1] is not a list of whole numbers"),
                            ("score", {**d["score"], "b": 7}, "its values are a int, not text")):
        with pytest.raises(ValueError, match=re.escape(f"field '{field}': {why}")):
            wire.cycle_from_wire({**d, field: bad})
    other = wire.cycle_from_wire(d, fetch=None)  # a thread whose lookup missed while another unpacked the field:
    object.__setattr__(other, "parents", c.parents)
    other.__dict__[RAW].pop("parents")
    assert torch.equal(other.__getattr__("parents"), c.parents)  # the value, not "did not travel"
    broken = wire.cycle_from_wire({**d, "score": {**d["score"], "b": "not base64!"}})  # the form is right
    with pytest.raises(ValueError, match=f"cycle {c.index}'s score: "):
        broken.score  # noqa: B018
    packed = tensor_codec.pack_tensor(c.tokens)
    broken = wire.cycle_from_wire({**d, "tokens": {**packed, "z": packed["z"][::-1]}})  # base64, not zlib
    with pytest.raises(ValueError, match=f"cycle {c.index}'s tokens: .*do not decompress"):
        broken.tokens  # noqa: B018


def test_records_must_be_view_or_full(server):
    remote = wb.connect(server.url, token=TOKEN)
    with pytest.raises(ValueError, match="records='all' must be 'view'"):
        remote.session("t1", records="all")
    status, reply = call(server, "GET", "/sessions/abc?records=all", token=TOKEN)
    assert (status, reply["field"]) == (422, "records")


# ------------------------------------------------------------------------------ the wire's tensors and bounds
def test_small_tensors_travel_as_lists_or_raw_bytes_and_come_back_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    cases = [torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1e-45]), torch.randn(3, 4, generator=g),
             torch.randn(5, generator=g).to(torch.bfloat16), torch.randn(5, generator=g).to(torch.float16),
             torch.randint(-2**40, 2**40, (6,), generator=g), torch.rand(4, 4, generator=g) > 0.5,
             torch.zeros(0, 3, dtype=torch.long), torch.randn(tensor_codec.LIST_MAX + 1, generator=g), torch.tensor(7)]
    for t in cases:
        d = tensor_codec.tensor_to_wire(t)
        small = t.numel() <= tensor_codec.LIST_MAX
        assert ("data" in d or "b" in d) == small and ("z" in d) == (not small), (t.dtype, list(d))
        tensor_codec.check_wire_tensor(wire.loads(wire.dumps(d)))  # what a view record's arrival check passes
        back = tensor_codec.unpack_tensor(wire.loads(wire.dumps(d)))
        assert back.dtype == t.dtype and back.shape == t.shape
        bits = (lambda x: x.reshape(-1).view(torch.uint8)) if t.is_floating_point() else (lambda x: x)
        assert torch.equal(bits(back), bits(t)), t


def test_the_gather_window_is_a_share_of_the_last_cycle_within_its_bounds():
    from workbench.engine.scheduler import BatchLimits

    lim = BatchLimits(gather_seconds=0.02, gather_share=0.5, gather_floor=0.003)
    assert [lim.window(c) for c in (0.0, 0.004, 0.01, 1.0)] == [0.003, 0.003, 0.005, 0.02]
    with pytest.raises(ValueError, match="gather_share"):
        BatchLimits(gather_share=-1)


def test_the_guard_aborts_a_connection_that_leaves_its_reply_untaken():
    from workbench.serve.transport import ConnectionGuard

    now = [0.0]
    guard = ConnectionGuard(8, 5.0, 5.0, clock=lambda: now[0], send_timeout=2.0)

    class Transport:
        aborted = False

        def abort(self):
            self.aborted = True

    class Conn:
        phase, since = "app", 0.0

        def __init__(self, paused):
            self.transport, self.write_paused_since = Transport(), paused

    stuck, reading = Conn(0.0), Conn(None)
    guard.open.update({stuck: None, reading: None})
    now[0] = 1.5
    assert guard.expire() == 0 and not stuck.transport.aborted
    now[0] = 2.5
    assert guard.expire() == 1 and stuck.transport.aborted and not reading.transport.aborted
    assert guard.closed["send_timeout"] == 1 and list(guard.open) == [reading]


def test_the_new_limits_are_checked_and_served(server):
    from workbench.serve import Limits

    for name, bad in (("max_stream_cycles", 0), ("max_stream_bytes", 1.5), ("max_stream_seconds", 0),
                      ("send_timeout", float("inf"))):
        with pytest.raises(ValueError, match=name):
            Limits(**{name: bad})
    limits = wb.connect(server.url, token=TOKEN).limits
    assert {"send_timeout", "max_stream_cycles", "max_stream_bytes", "max_stream_seconds"} <= set(limits)


def test_the_same_requests_and_streams_through_urllib(eng, server):
    """A server on another host is reached through urllib (a connection per request, the environment's proxy):
    the same answers, streams included, and the same refusals."""
    remote = wb.connect(server.url, token=TOKEN)
    remote._http.conns.keep_alive = False  # as for a host other than this machine
    s = remote.session("t1 t2 t3", policy=wb.DDTree(5), max_new_tokens=MAX_NEW, records="full")
    s.step()
    s.run()
    ref = local_run(eng)
    assert s.tokens == ref.tokens and len(s.cycles) == len(ref.cycles)
    with pytest.raises(wb.remote.LimitExceeded, match="max_new_tokens"):
        s.run(max_new_tokens=5000)
    s.close()
    with pytest.raises(wb.remote.UnknownSession):
        s.step()
