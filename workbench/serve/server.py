"""The served engine's server: one loaded engine, served over HTTP to many notebooks (``python -m workbench serve``).

    server = EngineServer(wb.load(), port=0)      # binds 127.0.0.1 on a free port, makes a token
    server.start()                                # in a thread (tests, notebooks); server.run() blocks
    remote = wb.connect(server.url, token=server.token)
    server.stop()

The CLI runs ``server.run()`` in the main thread: SIGINT / SIGTERM stop it cleanly
(a running cycle finishes, a running ``/run`` returns the cycles it ran, live sessions are
dropped with a log line, exit code 0).
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import errno
import socket
import threading
import warnings

try:
    import fastapi  # noqa: F401  (app.py builds on it)
    import uvicorn
except ImportError as e:  # the engine and wb.connect run without the server's stack
    from workbench.extras import missing

    raise ImportError(missing("`workbench serve`", e.name or "fastapi"), name=e.name) from e

from workbench.serve.app import create_app
from workbench.serve.store import Limits, ServeError, SessionStore
from workbench.serve.transport import ConnectionGuard
from workbench.serve.wire import is_loopback

__all__ = ["EngineServer", "Limits", "MIN_TOKEN_CHARS", "ServeError", "SessionStore", "is_loopback", "new_token"]

log = logging.getLogger("workbench.serve")
MIN_TOKEN_CHARS = 32  # a generated token has 43 (32 random bytes)
# The event loop accepts up to BACKLOG connections in one burst before any of them is seen (and a stalled one
# evicted), so the connection cap leaves room for a burst plus FD_RESERVE descriptors (the loop, logs, files).
BACKLOG = 64
FD_RESERVE = 32


def new_token() -> str:
    return secrets.token_urlsafe(32)


def check_token(token, origin: str = "token", fix: str = "leave it out to have one generated") -> str:
    """A token the server may use: text, no surrounding spaces, at least MIN_TOKEN_CHARS characters."""
    if not isinstance(token, str) or token != token.strip() or len(token) < MIN_TOKEN_CHARS:
        got = f"{len(token)} characters" if isinstance(token, str) else type(token).__name__
        raise ValueError(f"{origin}: a token must be text of at least {MIN_TOKEN_CHARS} characters without "
                         f"surrounding spaces (got {got}); {fix}")
    return token


def connection_cap(wanted: int) -> int:
    """``wanted``, lowered so that the open-files limit can never be reached by connections."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return wanted
    if soft == getattr(resource, "RLIM_INFINITY", -1):
        return wanted
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64
    room = max(1, soft - in_use - FD_RESERVE - BACKLOG)
    if room < wanted:
        log.warning("max_connections=%d lowered to %d: the open-files limit is %d (ulimit -n) and %d are in use",
                    wanted, room, soft, in_use)
    return min(wanted, room)


class _Uvicorn(uvicorn.Server):
    """uvicorn, except that a signal stops the server and is then forgotten (uvicorn re-raises it,
    which would end the process with a KeyboardInterrupt traceback or a signal exit code)."""

    def __init__(self, config, owner: "EngineServer"):
        super().__init__(config)
        self.owner = owner
        self._sweep: asyncio.Task | None = None

    async def startup(self, sockets=None) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self.owner.guard.loop_exception)
        self._sweep = loop.create_task(self.owner.guard.sweep())
        await super().startup(sockets)

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets)  # stalled connections still time out while running requests drain
        if self._sweep is not None:
            self._sweep.cancel()

    def capture_signals(self):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            sigs = (signal.SIGINT, signal.SIGTERM)
            old = {s: signal.signal(s, self._on_signal) for s in sigs}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

        return ctx()

    def _on_signal(self, sig, _frame) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for running requests
        self.owner.stopped_by = signal.Signals(sig).name
        self.owner.store.stopping.set()  # running runs end at their next cycle and return what they ran
        self.should_exit = True


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``; a port in use (or a host that is not this machine's) is one line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        why = e.strerror or str(e)
        fix = ("; another program (or server) uses it: stop it, or pick another --port (0 picks a free one)"
               if e.errno == errno.EADDRINUSE else "")
        raise OSError(f"cannot listen on {host}:{port}: {why}{fix}") from None


class EngineServer:
    """An engine served on ``host:port`` (port 0: a free one) with a bearer token (generated if not given).

    Binding anything but a loopback address warns (``UserWarning``): anyone who can reach the port
    and holds the token runs the engine, over plain HTTP."""

    def __init__(self, engine, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 limits: Limits = Limits(), log_level: str = "warning", sock: socket.socket | None = None):
        """``sock``: a socket already listening on ``host:port`` (``listen()``), so that ``serve`` refuses a port
        in use before it loads the models."""
        from workbench.engine.validate import port as check_port

        check_port(port)  # one line for 99999, as `serve --port 99999` gives
        self.token = new_token() if token is None else check_token(token)
        if not is_loopback(host):
            msg = (f"EngineServer: binding {host} makes the engine reachable from other machines over plain "
                   "HTTP; anyone with the token can run it. Prefer 127.0.0.1 and an SSH tunnel.")
            warnings.warn(msg, UserWarning, stacklevel=2)
            log.warning(msg)
        self.store = SessionStore(engine, limits)
        self.app = create_app(self.store, self.token)
        self.guard = ConnectionGuard(connection_cap(limits.max_connections), limits.header_timeout,
                                     limits.body_timeout, send_timeout=limits.send_timeout)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = sock if sock is not None else listen(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.url = f"http://{shown}:{self.port}"
        config = uvicorn.Config(self.app, http=self.guard.protocol(), log_level=log_level, access_log=False,
                                lifespan="off", timeout_graceful_shutdown=5, backlog=BACKLOG)
        self._server = _Uvicorn(config, self)
        self._thread: threading.Thread | None = None
        self.stopped_by: str | None = None

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def run(self) -> list[str]:
        """Serve until stopped (a signal, or stop() from another thread). -> the dropped session ids."""
        self.store.start_sweeper()
        try:
            self._server.run(sockets=[self.sock])
        finally:
            self.store.stopping.set()
            self.sock.close()
        dropped = self.store.drop_all()
        self.store.close()
        self.store.release_memory()
        log.info("stopped%s; dropped %d live session(s)%s", f" ({self.stopped_by})" if self.stopped_by else "",
                 len(dropped), (": " + ", ".join(dropped)) if dropped else "")
        return dropped

    def start(self, timeout: float = 30.0) -> "EngineServer":
        """Serve from a daemon thread; returns once requests are accepted."""
        self._thread = threading.Thread(target=self.run, name="workbench-serve", daemon=True)
        self._thread.start()
        for _ in range(int(timeout / 0.01)):
            if self._server.started or not self._thread.is_alive():
                break
            threading.Event().wait(0.01)
        if not self._server.started:
            raise RuntimeError(f"the server did not start within {timeout} s")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.store.stopping.set()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    def __repr__(self) -> str:
        return f"EngineServer({self.url}, {len(self.store)} live sessions)"
