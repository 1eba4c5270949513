"""The client's HTTP connections: kept open between requests to a server on this machine, one per thread.

A step of a remote session is one small request; opening a TCP connection for each (what
``urllib`` does) adds a connect, an accept and a new protocol object on the server to every
cycle. To a loopback server (the usual case: on this machine, or through an SSH tunnel) each
thread keeps one HTTP/1.1 connection and reuses it while it is fresh: one idle for longer than
``REUSE_SECONDS`` is replaced (uvicorn closes idle ones after 5 s), and a reused one that turns
out closed (the server dropped it as idle or to make room) is replaced once and the request sent
again. Anything else goes through ``urllib`` with the opener the client gives (proxies honoured,
redirects refused), a connection per request.

Only bytes pass here: statuses, redirects and errors are the client's (``workbench.serve.client``).
"""
from __future__ import annotations

import http.client
import threading
import time
import urllib.error
import urllib.request

REUSE_SECONDS = 4.0  # reuse a connection idle for at most this long (the server closes idle ones after 5 s)
# What a reused connection the server has already closed raises on the next request: safe to send again, as
# the server never read it (it closes only connections without a request in flight)
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class Reply:
    """One answer: ``status``, ``headers``, the body by ``read()`` (all) or ``readline()`` (a stream's line).
    ``close()`` when done with it: a connection whose body was read to the end goes back for reuse."""

    def __init__(self, status: int, headers, body, done):
        """``done(complete)``: hands the connection back (or closes it) when the answer is done with."""
        self.status, self.headers, self._body, self._done = status, headers, body, done

    def read(self) -> bytes:
        data = self._body.read()
        self.close(complete=True)
        return data

    def readline(self, limit: int = -1) -> bytes:
        return self._body.readline(limit)

    def close(self, complete: bool = False) -> None:
        """Done with this answer (``complete``: its body was read to the end). Once; later calls do nothing."""
        done, self._done = self._done, None
        if done is None:
            return
        done(complete or self._body.isclosed())


class Connections:
    """``send(method, path, data, headers) -> Reply`` to one server, kept-alive per thread when ``keep_alive``."""

    def __init__(self, scheme: str, host: str, port: int | None, base: str, timeout: float, keep_alive: bool,
                 opener: urllib.request.OpenerDirector):
        self.scheme, self.host, self.port, self.base, self.timeout = scheme, host, port, base, timeout
        self.keep_alive, self.opener = keep_alive, opener
        self.local = threading.local()

    # -------------------------------------------------------------- kept-alive (loopback)
    def fresh(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def take(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's idle connection if it is fresh enough (-> it, True), else a new one (-> it, False).
        It leaves the thread's slot while in use: a request made meanwhile (none should be) opens its own."""
        held = getattr(self.local, "idle", None)
        self.local.idle = None
        if held is not None:
            conn, since = held
            if time.monotonic() - since <= REUSE_SECONDS:
                return conn, True
            conn.close()
        return self.fresh(), False

    def give_back(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        if not reusable:
            conn.close()
            return
        old = getattr(self.local, "idle", None)
        if old is not None:
            old[0].close()
        self.local.idle = (conn, time.monotonic())

    def send(self, method: str, path: str, data: bytes | None, headers: dict) -> Reply:
        if not self.keep_alive:
            return self.send_once(method, path, data, headers)
        conn, reused = self.take()
        while True:
            try:
                conn.request(method, self.base + path, body=data, headers=headers)
                r = conn.getresponse()
                break
            except STALE:
                conn.close()
                if not reused:
                    raise
                conn, reused = self.fresh(), False  # the server had closed it: once more on a new one
            except BaseException:
                conn.close()
                raise
        return Reply(r.status, r.headers, r, lambda complete: self.give_back(conn, complete and not r.will_close))

    # -------------------------------------------------------------- one connection per request (urllib)
    def send_once(self, method: str, path: str, data: bytes | None, headers: dict) -> Reply:
        req = urllib.request.Request(f"{self.scheme}://{self.netloc()}{self.base}{path}", data=data, method=method,
                                     headers=headers)
        try:
            r = self.opener.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:  # a 4xx / 5xx still has a body: the server's one-line refusal
            return Reply(e.code, e.headers, e, lambda complete, body=e: body.close())
        return Reply(r.status, r.headers, r, lambda complete: r.close())

    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def close(self) -> None:
        """Close this thread's idle connection (others close when their threads end)."""
        held = getattr(self.local, "idle", None)
        self.local.idle = None
        if held is not None:
            held[0].close()
