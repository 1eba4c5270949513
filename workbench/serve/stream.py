"""``POST /sessions/{id}/run`` as one streamed reply: the session's cycles, one JSON line each, as they are made.

The request is made once and its cycles come back as they finish, each as soon as it exists, so a run
costs one round trip however many cycles it has (not one per cycle, nor one reply at the end holding
everything). Two threads share the work: a *producer* (one of
the server's worker threads, holding the session for the whole stream) steps the session, each cycle
encoded as it is made, and the event loop writes the encoded cycles while the next one runs.

Bounds (docs/wire-format.md, "/run streams"): a stream carries at most ``max_stream_cycles`` cycles,
about ``max_stream_bytes`` bytes and lasts at most ``max_stream_seconds``; past one of them it ends
with its last frame naming the bound, and the client asks again (``since`` = the cycles it holds).
The producer runs at most ``AHEAD`` cycles past what has been handed to the connection, so a
client that stops reading stops its run; a connection that takes no bytes for ``send_timeout`` is
closed (``workbench.serve.transport``), and a client that goes away stops it at the next cycle.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

import anyio.to_thread
from starlette.responses import Response

from workbench.engine.core import SessionFinished
from workbench.serve import wire
from workbench.serve.replies import cycle_frame, session_state, step_timing
from workbench.serve.store import ServeError

log = logging.getLogger("workbench.serve")
AHEAD = 4  # cycles the producer may run past what the connection has taken: a stream that is not read stops


def as_serve_error(ex: BaseException, stopping: bool = False) -> ServeError:
    """What a failed cycle becomes in a stream's last frame: the status and code its plain reply would have.
    While the server stops, any failure is the stop (the scheduler refuses what it had not started)."""
    if isinstance(ex, ServeError):
        return ex
    if stopping:
        return ServeError(503, "stopping", "the server is shutting down; no more cycles are run")
    if isinstance(ex, SessionFinished):
        return ServeError(409, "session_finished", str(ex))
    if isinstance(ex, ValueError):
        return ServeError(422, "invalid", " ".join(str(ex).split()))
    return ServeError(500, "internal", "unexpected server error (logged on the server)")


class RunStream(Response):
    """The streamed reply of one /run: started by the route (which holds the session and has checked the
    request), then sent by Starlette calling it. ``release()`` hands the session back; it runs once, when
    the producer ends (or at once, if the stream never started)."""

    media_type = "application/x-ndjson"

    def __init__(self, e, release, since: int, records: str, timing: bool, limits, stopping: threading.Event,
                 have_tokens: int | None = None, revision: int | None = None):
        super().__init__(status_code=200, media_type=self.media_type)
        self.e, self.s, self.limits, self.stopping = e, e.session, limits, stopping
        self.records, self.timing = records, timing
        # what the client holds besides the cycles (the frames carry none of it): the last line carries the rest
        self.have_tokens, self.revision = have_tokens, revision
        self.first = min(since, len(self.s.cycles))  # the first cycle this stream sends (the client lacks it)
        self.sent = self.first  # cycles handed to the connection (the event loop's count)
        self.made = len(self.s.cycles)  # cycles ready to send (the producer's count, once their frames are in)
        self.cond = threading.Condition()
        self.reason: str | None = None  # why the stream ends: "finished", a bound, "client_gone", "error"
        self.error: ServeError | None = None
        self.last_frame: bytes | None = None  # the producer's final frame (built while it holds the session)
        # cycle index -> its line, encoded by the thread that made the cycle (see produce); the event loop
        # encodes only the backlog made before this run
        self.frames: dict[int, bytes] = {}
        self.started = time.monotonic()
        self.stepped = 0  # cycles this stream's run made (the backlog was made before it)
        self._release, self._released = release, False

    # -------------------------------------------------------------- the session's side (the producer thread)
    def stop(self, reason: str) -> None:
        with self.cond:
            if self.reason is None:
                self.reason = reason
            self.cond.notify_all()

    def more(self) -> bool:
        """Whether the run goes on for another cycle now: False once it has ended (and why is set), or while
        the connection has not taken the last AHEAD cycles (the producer then waits for it)."""
        s, lim = self.s, self.limits
        if s.finished:
            self.stop("finished")
        elif len(s.cycles) - self.first >= lim.max_stream_cycles:
            self.stop("max_stream_cycles")
        elif self.stepped and time.monotonic() - self.started >= lim.max_stream_seconds:
            self.stop("max_stream_seconds")  # (after one cycle at least: every stream makes progress)
        with self.cond:
            return self.reason is None and len(s.cycles) - self.sent < AHEAD

    def release(self) -> None:
        with self.cond:
            if self._released:
                return
            self._released = True
        self._release()

    def produce(self, wake, done: threading.Event) -> None:
        s = self.s

        def each(c, asked: float) -> None:  # in the thread that made the cycle (a scheduler's: keep it short)
            # Encoded here, not in the event loop: encoding calls into torch, and each such call lets go of the
            # interpreter lock, which the cycle's thread then takes, so the event loop would wait for it once per
            # tensor of every frame (and the cycle for the event loop), instead of once per frame.
            timing = step_timing(time.perf_counter() - asked, c, asked) if self.timing else None
            self.frames[c.index] = cycle_frame(c, self.records, timing)
            self.made, self.stepped = len(s.cycles), self.stepped + 1
            wake()

        try:
            while True:
                with self.cond:
                    while self.reason is None and len(s.cycles) - self.sent >= AHEAD:
                        self.cond.wait(0.5)  # the connection has not taken the last cycles yet
                if not self.more():
                    break
                s.step_while(self.more, each)  # until a bound, the end, or AHEAD cycles not yet taken
        except BaseException as ex:  # noqa: BLE001 - it ends the stream, in its last frame
            err = as_serve_error(ex, self.stopping.is_set())
            if err.status == 500:
                log.error("session %s: a cycle of a run failed", self.e.id, exc_info=ex)
            self.error = err
            self.stop("error")
        finally:
            try:
                self.last_frame = self.final_frame()
            except BaseException as ex:  # noqa: BLE001 - the stream still ends, without the state
                log.error("session %s: the run's last frame failed", self.e.id, exc_info=ex)
                self.last_frame = wire.dumps({"error": "internal", "status": 500,
                                              "message": "unexpected server error (logged on the server)"}) + b"\n"
            self.release()
            done.set()  # before the wake: the event loop, woken, must see that the producer has ended
            wake()

    def final_frame(self) -> bytes:
        s = self.s
        n = len(s.cycles)
        # no cycles (they went as frames), and what changed since the request: the new tokens and text; the full
        # state only if the client's revision is not the session's (a max_new_tokens in the request bumps it)
        state = session_state(self.e, n, n, records=self.records, have_tokens=self.have_tokens, revision=self.revision)
        if self.reason == "client_gone":
            log.info("session %s: the client went away; its run stopped after %d cycles", self.e.id, self.stepped)
        if self.error is not None:
            msg = self.error.message
            if self.error.code == "stopping":
                msg = (f"the server is shutting down: this run stopped after {self.stepped} cycle(s), which came back "
                       "before this line (they are in the session's trace)")
            head = wire.dumps({**ServeError(self.error.status, self.error.code, msg, self.error.field,
                                            self.error.limit).to_dict(), "status": self.error.status})
        else:
            head = wire.dumps({"end": self.reason})
        return head[:-1] + b',"state":' + state + b"}\n"  # the state's encoding spliced in, not re-encoded

    # -------------------------------------------------------------- the connection's side (the event loop)
    async def watch(self, receive) -> None:
        """A client that goes away stops the run at its next cycle (its frames would go nowhere)."""
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                self.stop("client_gone")
                return

    async def __call__(self, scope, receive, send) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        done = threading.Event()

        def wake() -> None:  # from the producer: a cycle is ready, or it ended
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:  # the loop has closed (the server stopped): no one is left to tell
                pass

        # The producer runs in the server's worker threads (anyio's, as every model route does), not a thread
        # of its own per stream: a session driven apart computes its cycles in the producer's thread, and a
        # new thread per stream would start a new set of OpenMP threads each time.
        producer = None
        watcher = asyncio.ensure_future(self.watch(receive))
        lim, nbytes = self.limits, 0
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", self.media_type.encode()), (b"cache-control", b"no-store")]})
            producer = asyncio.ensure_future(anyio.to_thread.run_sync(self.produce, wake, done))
            ready.set()  # the cycles the client lacked before this run began go first
            while True:
                await ready.wait()
                ready.clear()
                ended = done.is_set()
                end = min(self.made, self.first + lim.max_stream_cycles)
                chunk = []
                while self.sent + len(chunk) < end and nbytes < lim.max_stream_bytes:
                    i = self.sent + len(chunk)
                    frame = self.frames.pop(i, None) or cycle_frame(self.s.cycles[i], self.records)
                    chunk.append(frame)
                    nbytes += len(frame)
                if chunk:
                    await send({"type": "http.response.body", "body": b"".join(chunk), "more_body": True})
                    with self.cond:
                        self.sent += len(chunk)
                        self.cond.notify_all()
                if nbytes >= lim.max_stream_bytes:
                    self.stop("max_stream_bytes")  # the producer ends at its next cycle boundary and wakes us
                if ended:
                    break
            await send({"type": "http.response.body", "body": self.last_frame or b"", "more_body": False})
        finally:
            self.stop("client_gone")  # (no-op once it has ended for another reason)
            watcher.cancel()
            if producer is None:
                self.release()  # the producer never started: the session is handed back here
