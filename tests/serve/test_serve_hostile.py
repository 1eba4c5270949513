"""The served engine under hostile and careless load, on loopback only, bounded in time.

Stalled and excess connections cost nothing, a huge body is refused unread, a huge tree's cycle
stays small on the wire, replies come in pages, a client that goes away stops its run, and the
client never hands its token to anyone but the server it was given.
"""
from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
import urllib.request

import psutil
import pytest

import workbench as wb
from workbench.serve import wire
from workbench.serve.client_http import Http
from workbench.serve import EngineServer, Limits
from workbench.serve.transport import ConnectionGuard

PROMPT = "def parse(line):\n    "
HEADER_TIMEOUT = BODY_TIMEOUT = 1.0
MAX_CONNECTIONS, MAX_BODY, MAX_REPLY = 24, 2**20, 64 * 2**10
LIMITS = Limits(max_sessions=8, max_new_tokens=1000, max_budget=1024, session_ttl=120.0, max_connections=MAX_CONNECTIONS,
                header_timeout=HEADER_TIMEOUT, body_timeout=BODY_TIMEOUT, max_reply_bytes=MAX_REPLY, max_body_bytes=MAX_BODY)
TOKEN = "a-test-token-of-forty-characters-0123456"


@pytest.fixture(scope="module")
def server(engine):
    s = EngineServer(engine, port=0, token=TOKEN, limits=LIMITS).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def remote(server):
    return wb.connect(server.url, token=TOKEN)


def request(server, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """One request by hand (a fresh connection) -> (status, raw reply body)."""
    req = urllib.request.Request(server.url + path, data=body, method=method,
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def read_reply(sock: socket.socket, limit: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (or ``limit`` seconds pass) -> (bytes, seconds)."""
    t0, data = time.monotonic(), b""
    sock.settimeout(limit)
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and _complete(data):
                break
    except (socket.timeout, ConnectionResetError):
        pass
    return data, time.monotonic() - t0


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def health_latencies(server, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        status, _ = request(server, "GET", "/health")
        out.append(time.perf_counter() - t)
        assert status == 200
    return sorted(out)


def listing(remote, sid: str) -> dict:
    return next(s for s in remote.sessions() if s["id"] == sid)


# ------------------------------------------------------------------------------ connections
def test_stalled_connections_are_closed_and_health_stays_fast(server):
    host, port = server.host, server.port
    stalled = []
    for _ in range(200):  # unfinished heads, as a one-byte-per-second trickle leaves them
        s = socket.create_connection((host, port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        stalled.append(s)
    lat = health_latencies(server, 20)
    p50, worst = lat[len(lat) // 2], lat[-1]
    print(f"\n/health with 200 stalled sockets (max_connections={MAX_CONNECTIONS}): "
          f"p50 {1e3 * p50:.1f} ms, max {1e3 * worst:.1f} ms")
    assert worst < 1.0
    # A head that stalls is closed by its deadline, and told why.
    probe = socket.create_connection((host, port))
    probe.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\n")
    data, took = read_reply(probe, HEADER_TIMEOUT + 3)
    assert data.startswith(b"HTTP/1.1 408"), data[:80]
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"] == "timeout"
    assert HEADER_TIMEOUT - 0.05 < took < HEADER_TIMEOUT + 1.0, took
    # So is a body that stops after its head.
    body = socket.create_connection((host, port))
    body.sendall(f"POST /sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: "
                 "application/json\r\nContent-Length: 100\r\n\r\n{\"pro".encode())
    data, took = read_reply(body, BODY_TIMEOUT + 3)
    assert took < BODY_TIMEOUT + 1.0 and b"201" not in data[:12], (took, data[:80])
    assert server.guard.closed["evicted"] >= 200 - MAX_CONNECTIONS  # the flood made room for the newcomers
    time.sleep(HEADER_TIMEOUT + 0.5)  # the survivors of the flood expire too
    assert len(server.guard.open) == 0, [p.phase for p in server.guard.open]
    for s in [*stalled, probe, body]:
        s.close()


def test_accept_errors_are_logged_once_per_interval(caplog):
    now = [0.0]
    guard = ConnectionGuard(4, 1.0, 1.0, clock=lambda: now[0])
    other = []

    class Loop:
        def default_exception_handler(self, context):
            other.append(context)

    out_of_fds = {"message": "socket.accept() out of system resource", "exception": OSError(24, "Too many open files")}
    with caplog.at_level(logging.WARNING, logger="workbench.serve"):
        for _ in range(1000):
            guard.loop_exception(Loop(), out_of_fds)
        assert len(caplog.records) == 1 and "Too many open files" in caplog.records[0].getMessage()
        now[0] = 10.5
        guard.loop_exception(Loop(), out_of_fds)
        assert len(caplog.records) == 2 and "1000 time(s)" in caplog.records[1].getMessage()
    guard.loop_exception(Loop(), {"message": "something else"})
    assert len(other) == 1  # everything else goes to the loop's own handler


# ------------------------------------------------------------------------------ requests
def test_huge_bodies_and_prompts_are_refused_without_stalling_others(server, remote, engine):
    rs = remote.session(PROMPT, policy=wb.AR(), max_new_tokens=1000)
    lat, stop, errors = [], threading.Event(), []

    def stepper():
        try:
            while not stop.is_set() and not rs.finished:
                t = time.perf_counter()
                rs.step()
                lat.append((time.monotonic(), time.perf_counter() - t))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=stepper)
    thread.start()
    try:
        t0 = time.monotonic()
        while len(lat) < 3 and time.monotonic() - t0 < 30:  # the normal latency, first
            time.sleep(0.01)
        w0 = time.monotonic()
        # 10 MB announced, as curl sends it (Expect: 100-continue): the 413 comes back before any body is read.
        sock = socket.create_connection((server.host, server.port))
        t = time.perf_counter()
        sock.sendall(f"POST /sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: "
                     "application/json\r\nExpect: 100-continue\r\nContent-Length: 10000000\r\n\r\n".encode())
        data, _ = read_reply(sock, 5)
        refused = time.perf_counter() - t
        sock.close()
        assert data.startswith(b"HTTP/1.1 413"), data[:80]
        reply = json.loads(data.partition(b"\r\n\r\n")[2])
        assert (reply["error"], reply["limit"]) == ("limit_exceeded", "max_body_bytes") and refused < 1.0
        # Sent anyway, without a length (chunked): cut off at the limit, still a 413, and the client reads it.
        sock = socket.create_connection((server.host, server.port))
        sock.sendall(f"POST /sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: "
                     "application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"x" * 2**16
        for _ in range(MAX_BODY // len(chunk) + 2):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sock.sendall(b"0\r\n\r\n")
        data, _ = read_reply(sock, 5)
        sock.close()
        assert data.startswith(b"HTTP/1.1 413"), data[:80]
        # The Python client says so before sending anything.
        t = time.perf_counter()
        with pytest.raises(wb.remote.LimitExceeded, match="max_body_bytes=1048576") as e:
            remote.session("x" * 10_000_000)
        assert e.value.limit == "max_body_bytes" and time.perf_counter() - t < 1.0
        # A 900 kB prompt fits the body limit but not the model: refused by its length, never tokenized.
        t = time.perf_counter()
        status, raw = request(server, "POST", "/sessions", wire.dumps({"prompt": "word " * 180_000}))
        long_prompt = time.perf_counter() - t
        reply = json.loads(raw)
        assert (status, reply["error"], reply["field"]) == (422, "limit_exceeded", "prompt") and long_prompt < 1.0
        assert "characters" in reply["message"] and len(reply["message"]) < 300
        w1 = time.monotonic()
        n = len(lat)
        while len(lat) < n + 2 and time.monotonic() - w1 < 30:  # and the steps that overlapped the refusals
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    before = sorted(d for at, d in lat if at < w0)
    during = [d for at, d in lat if at >= w0][:n + 2 - len(before)]
    med = before[len(before) // 2]
    print(f"\n10 MB body refused in {1e3 * refused:.1f} ms, 900 kB prompt in {1e3 * long_prompt:.1f} ms; "
          f"another session's step: median {1e3 * med:.1f} ms before, max {1e3 * max(during):.1f} ms meanwhile")
    assert during and max(during) < 0.5 + 3 * med
    rs.close()


# ------------------------------------------------------------------------------ replies
def test_a_ddtree_1024_cycle_is_small_on_the_wire(server, remote, engine):
    local = engine.session(PROMPT, policy=wb.DDTree(1024), max_new_tokens=64)
    rs = remote.session(PROMPT, policy=wb.DDTree(1024), max_new_tokens=64)
    c = local.step()
    status, raw = request(server, "POST", f"/sessions/{rs.id}/step", wire.dumps({"since": 0}))
    assert status == 200 and c.n_nodes == 1024
    old = len(wire.dumps(c.to_dict()))
    print(f"\none DDTree(1024) cycle: {len(raw)} bytes in a /step reply ({len(wire.dumps(wire.cycle_to_wire(c)))} "
          f"for the cycle); wire version 1 sent {old} for the cycle alone")
    assert len(raw) <= 64 * 2**10 and old > 50 * len(raw)
    rs.refresh()
    got = rs.cycles[0].to_dict()
    want = c.to_dict()
    got.pop("stage_seconds"), want.pop("stage_seconds")
    assert got == want  # visibility rebuilt from parents, every tensor bit for bit
    rs.close()


def test_replies_come_in_pages_and_reattach_is_lazy(server, remote):
    rs = remote.session(PROMPT, policy=wb.DDTree(64), max_new_tokens=160)
    rs.run()
    n = len(rs.cycles)
    status, raw = request(server, "GET", f"/sessions/{rs.id}?since=0")
    page = json.loads(raw)
    assert status == 200 and page["n_cycles"] == n and 0 < page["until"] < n, "the trace should need pages"
    assert len(raw) <= MAX_REPLY + 16 * 2**10  # the budget, plus the state around the cycles
    again = wb.connect(server.url, token=TOKEN)
    calls = []
    http_call = again._http.__call__

    def counted(method, path, body=None):
        calls.append(path)
        return http_call(method, path, body)

    again._http = counted
    s2 = again.session_by_id(rs.id)
    assert len(calls) == 1 and s2._trace.cycles == [] and s2.text == rs.text  # the state now, no cycles yet
    assert [c.to_dict() for c in s2.trace.cycles] == [c.to_dict() for c in rs.trace.cycles]
    assert len(calls) >= 3, calls  # the trace came in pages when first read
    rs.close()


# ------------------------------------------------------------------------------ lifecycle
def test_a_client_that_goes_away_stops_its_run(server, remote):
    rs = remote.session(PROMPT, policy=wb.AR(), max_new_tokens=1000)
    entry = server.store._entries[rs.id]
    step = entry.session.step

    def slow_step():  # a slow model, so that the run is surely still going when its client leaves
        time.sleep(0.02)
        return step()

    entry.session.step = slow_step
    sock = socket.create_connection((server.host, server.port))
    body = b'{"since": 0}'
    sock.sendall(f"POST /sessions/{rs.id}/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: "
                 f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    t0 = time.monotonic()
    while listing(remote, rs.id)["n_cycles"] < 5 and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    # One request may wait behind the run; the next is refused at once.
    waiting = []
    queued = threading.Thread(target=lambda: waiting.append(request(server, "GET", f"/sessions/{rs.id}?until=0")))
    queued.start()
    while entry.busy < 2 and time.monotonic() - t0 < 30:  # the run, and the request waiting behind it
        time.sleep(0.02)
    status, raw = request(server, "GET", f"/sessions/{rs.id}?until=0")
    assert (status, json.loads(raw)["error"]) == (429, "session_busy")
    sock.close()  # the client goes away mid-run
    queued.join(10)
    assert waiting and waiting[0][0] == 200  # the waiting request ran once the run stopped
    stopped = listing(remote, rs.id)["n_cycles"]
    time.sleep(0.3)
    assert listing(remote, rs.id)["n_cycles"] == stopped < 100 and not listing(remote, rs.id)["busy"]
    rs.step()  # the session goes on for a client that is still there
    assert len(rs.cycles) == stopped + 1
    rs.close()


def test_health_reports_what_the_process_holds(remote):
    h = remote.health()
    rss = psutil.Process().memory_info().rss
    assert h["rss_bytes"] is not None and 0.75 * rss < h["rss_bytes"] < 1.25 * rss


# ------------------------------------------------------------------------------ the client and its token
def test_the_client_never_sends_its_token_elsewhere(server):
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            seen.append((self.server.server_port, self.path, self.headers.get("Authorization")))
            if self.server is redirector:
                self.send_response(307)
                self.send_header("Location", f"http://127.0.0.1:{elsewhere.server_port}/info")
                self.end_headers()
            else:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

        def log_message(self, *a):
            pass

    redirector = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    elsewhere = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    for srv in (redirector, elsewhere):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(wb.remote.RemoteError, match="never follows redirects") as e:
            wb.connect(f"http://127.0.0.1:{redirector.server_port}", token=TOKEN)
        assert e.value.status == 307
        assert [p for p, *_ in seen] == [redirector.server_port]  # nothing reached the other host
    finally:
        redirector.shutdown(), elsewhere.shutdown()
    t = time.perf_counter()
    with pytest.raises(ValueError, match="plain http to 192.0.2.1.*insecure_http=True"):
        wb.connect("http://192.0.2.1:8765", token=TOKEN)
    assert time.perf_counter() - t < 0.5  # refused before any connection is tried
    assert Http("http://192.0.2.1:8765", TOKEN, 1.0, insecure_http=True).url == "http://192.0.2.1:8765"
    assert Http("https://192.0.2.1:8765", TOKEN, 1.0).url == "https://192.0.2.1:8765"


def test_binding_off_loopback_warns_from_python_too(engine):
    # 192.0.2.1 (a documentation address) is not on this machine: the warning comes, then the bind fails.
    with pytest.warns(UserWarning, match="binding 192.0.2.1 makes the engine reachable"):
        with pytest.raises(OSError, match="cannot listen on 192.0.2.1"):
            EngineServer(engine, host="192.0.2.1", port=0)
