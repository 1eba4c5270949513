"""Connections that cost nothing when they stall: read deadlines, a connection cap, quiet accept errors.

uvicorn's h11 protocol, with four additions (uvicorn itself has none of them):

- a connection that has not sent a whole request head within ``header_timeout`` seconds, or a
  whole body within ``body_timeout`` once the head is in, is closed (a 408 first if it sent
  part of a head). A request being served has no deadline: a long ``/run`` is fine.
- a connection whose client has taken none of a reply's bytes for ``send_timeout`` seconds (the
  socket's buffers full, the transport's writing paused) is aborted: a reply or a ``/run`` stream
  nobody reads must not hold the session, nor the bytes waiting for it, forever.
- at most ``max_connections`` are open; a new one closes the connection that has waited longest
  without a request in flight (a stalled head or an idle keep-alive), so stalled sockets can
  never lock out ``/health``. If every connection is serving a request, the newcomer is closed.
- the event loop's "socket.accept() out of system resource" errors (out of file descriptors)
  are logged once per interval with a count, not as one traceback per failed accept.
"""
from __future__ import annotations

import asyncio
import logging
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from workbench.serve import wire

log = logging.getLogger("workbench.serve")

TICK = 0.2  # seconds between deadline sweeps: a timeout fires at most this late
_TIMEOUT_BODY = wire.dumps({"error": "timeout", "message": "the request head did not arrive in time"})
_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY)


class RateLog:
    """One log line per ``every`` seconds per kind of event, with how many happened since the last."""

    def __init__(self, every: float = 10.0, clock=time.monotonic):
        self.every, self.clock = every, clock
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def note(self, kind: str, message: str, *args) -> bool:
        """Count one event; log it if the interval has passed. -> whether a line was written."""
        self._count[kind] = self._count.get(kind, 0) + 1
        now = self.clock()
        if now - self._last.get(kind, -float("inf")) < self.every:
            return False
        n, self._count[kind], self._last[kind] = self._count[kind], 0, now
        log.warning(message + " (%d time(s) since the last such line)", *args, n)
        return True


class ConnectionGuard:
    """Deadlines and the cap for one server's connections; ``protocol()`` is uvicorn's ``http`` class."""

    def __init__(self, max_connections: int, header_timeout: float, body_timeout: float, clock=time.monotonic,
                 send_timeout: float = 30.0):
        self.max_connections, self.header_timeout, self.body_timeout = max_connections, header_timeout, body_timeout
        self.send_timeout = send_timeout
        self.clock = clock
        self.open: dict = {}  # protocol -> None, oldest first
        self.rate = RateLog(clock=clock)
        self.closed = {"header_timeout": 0, "body_timeout": 0, "evicted": 0, "refused": 0, "send_timeout": 0}

    # -------------------------------------------------------------- the protocol's phases
    def set_phase(self, p, after_response: bool = False) -> None:
        """head: waiting for a request head; body: for its body; app: being served; idle: keep-alive."""
        st = p.conn.their_state
        if st is h11.IDLE:
            new = "head" if (not after_response or p.conn.trailing_data[0]) else "idle"
        elif st is h11.SEND_BODY:
            new = "body"
        else:
            new = "app"
        if new != p.phase:
            p.phase, p.since = new, self.clock()

    def admit(self, p) -> None:
        self.open[p] = None
        if len(self.open) <= self.max_connections:
            return
        waiting = [q for q in self.open if q is not p and q.phase in ("head", "idle")]
        victim = min(waiting, key=lambda q: q.since) if waiting else p
        kind = "evicted" if victim is not p else "refused"
        self.closed[kind] += 1
        self.rate.note(kind, "%d connections open (max_connections=%d): closed %s", len(self.open),
                       self.max_connections, "the longest-waiting one" if victim is not p else "a new one, "
                       "every open one is serving a request")
        self.close(victim)

    def close(self, p, reply: bytes = b"") -> None:
        self.open.pop(p, None)
        if not p.transport.is_closing():
            if reply:
                p.transport.write(reply)
            p.transport.close()

    def forget(self, p) -> None:
        self.open.pop(p, None)

    # -------------------------------------------------------------- deadlines
    def expire(self) -> int:
        """Close every connection past its phase's deadline, and abort those that have left a reply untaken
        for ``send_timeout``. -> how many."""
        now, n = self.clock(), 0
        for p in list(self.open):
            paused = getattr(p, "write_paused_since", None)
            if paused is not None and now - paused > self.send_timeout:
                self.closed["send_timeout"] += 1
                n += 1
                self.rate.note("send_timeout", "aborted a connection that took no reply bytes for %g s "
                               "(send_timeout)", self.send_timeout)
                self.open.pop(p, None)
                p.transport.abort()  # (close() would wait for the buffered bytes to be taken: they never are)
                continue
            limit = {"head": self.header_timeout, "body": self.body_timeout}.get(p.phase)
            if limit is not None and now - p.since > limit:
                kind = "header_timeout" if p.phase == "head" else "body_timeout"
                self.closed[kind] += 1
                n += 1
                log.debug("closing a connection: no whole request %s within %g s", p.phase, limit)
                # A client that sent part of a head is told why; a body's reader is the app (it sees a disconnect).
                self.close(p, _408 if p.phase == "head" and p.conn.trailing_data[0] else b"")
        return n

    async def sweep(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self.expire()
            except Exception:  # noqa: BLE001 - the sweep must outlive one bad pass
                log.exception("connection sweep failed")

    def loop_exception(self, loop, context: dict) -> None:
        """The event loop's error handler: accept failures once per interval, everything else as usual."""
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            exc = context.get("exception")
            self.rate.note("accept", "cannot accept connections: %s; raise the open-files limit (ulimit -n) "
                           "or lower --max-connections", exc)
            return
        loop.default_exception_handler(context)

    def protocol(self) -> type:
        guard = self

        class GuardedH11(H11Protocol):
            phase, since = "head", 0.0
            write_paused_since: float | None = None  # when the transport's buffer last filled up

            def connection_made(self, transport) -> None:
                super().connection_made(transport)
                self.phase, self.since = "head", guard.clock()
                guard.admit(self)

            def connection_lost(self, exc) -> None:
                guard.forget(self)
                super().connection_lost(exc)

            def data_received(self, data: bytes) -> None:
                super().data_received(data)
                guard.set_phase(self)

            def on_response_complete(self) -> None:
                super().on_response_complete()
                guard.set_phase(self, after_response=True)

            def pause_writing(self) -> None:
                super().pause_writing()
                self.write_paused_since = guard.clock()

            def resume_writing(self) -> None:
                super().resume_writing()
                self.write_paused_since = None

        return GuardedH11
