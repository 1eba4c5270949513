"""``python -m workbench serve``: one loaded engine, served over HTTP to many notebooks.

    server = EngineServer(wb.load(), port=0)      # binds 127.0.0.1 on a free port, makes a token
    server.start()                                # in a thread (tests, notebooks); server.run() blocks
    remote = wb.connect(server.url, token=server.token)
    server.stop()

The CLI runs ``server.run()`` in the main thread: SIGINT / SIGTERM stop it cleanly
(running cycles finish, live sessions are dropped with a log line, exit code 0).
"""
from __future__ import annotations

import logging
import secrets
import signal
import socket
import threading

import uvicorn

from workbench.serve.app import create_app
from workbench.wire import is_loopback
from workbench.serve.store import Limits, ServeError, SessionStore

__all__ = ["EngineServer", "Limits", "ServeError", "SessionStore", "is_loopback", "new_token"]

log = logging.getLogger("workbench.serve")


def new_token() -> str:
    return secrets.token_urlsafe(32)


class _Uvicorn(uvicorn.Server):
    """uvicorn, except that a signal stops the server and is then forgotten (uvicorn re-raises it,
    which would end the process with a KeyboardInterrupt traceback or a signal exit code)."""

    def __init__(self, config, owner: "EngineServer"):
        super().__init__(config)
        self.owner = owner

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
        self.owner.store.stopping.set()  # running runs end at their next cycle
        self.should_exit = True


class EngineServer:
    """An engine served on ``host:port`` (port 0: a free one) with a bearer token."""

    def __init__(self, engine, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 limits: Limits = Limits(), log_level: str = "warning"):
        from workbench.validate import port as check_port

        check_port(port)  # one line for 99999, as `serve --port 99999` gives
        if token is not None and (not isinstance(token, str) or len(token) < 8 or token != token.strip()):
            raise ValueError("token must be a string of at least 8 characters without surrounding spaces")
        self.token = token or new_token()
        self.store = SessionStore(engine, limits)
        self.app = create_app(self.store, self.token)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.sock = socket.create_server((host, port), family=family)
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        self.host, self.port = host, self.sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.url = f"http://{shown}:{self.port}"
        config = uvicorn.Config(self.app, log_level=log_level, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=5)
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
