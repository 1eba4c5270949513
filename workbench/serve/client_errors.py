"""The served client's errors: what a refusal from the server raises, one class per kind (``raise_for``).

Each carries the server's ``status`` (HTTP), ``code``, and the request ``field`` or ``limit`` it names; the
classes also derive from the local engine's error of the same meaning (a bad value is a ``ValueError``, a
finished session a ``SessionFinished``), so code written for a local session catches them unchanged.
"""
from __future__ import annotations

from workbench.engine.core import SessionFinished
from workbench.serve.wire import WireVersionError

class RemoteError(RuntimeError):
    """The server refused a request: ``status`` (HTTP), ``code``, and the ``field`` / ``limit`` it names."""

    def __init__(self, message: str, status: int = 0, code: str = "", field: str | None = None,
                 limit: str | None = None, state: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.field, self.limit = status, code, field, limit
        self.state = state  # a session state that came with the refusal (a run stopped by the server)


class Unauthorized(RemoteError):
    """A missing or wrong token."""


class UnknownSession(RemoteError, LookupError):
    pass


class InvalidRequest(RemoteError, ValueError):
    """A bad value (as a local ValueError would be)."""


class LimitExceeded(InvalidRequest):
    """Over one of the server's limits (``limit`` names it)."""


class RemoteSessionFinished(RemoteError, SessionFinished):
    pass


class SessionBusy(RemoteError):
    """The session already has a request running and another waiting (429); retry when they are done."""


def raise_for(status: int, body) -> None:
    if not isinstance(body, dict) or "error" not in body:
        raise RemoteError(f"HTTP {status} from the server: {str(body)[:200]}", status)
    code, msg = body["error"], body.get("message", "")
    state = body.get("state") if isinstance(body.get("state"), dict) else None
    kw = dict(status=status, code=code, field=body.get("field"), limit=body.get("limit"), state=state)
    if code == "wire_version":
        raise WireVersionError(msg)
    cls = {"unauthorized": Unauthorized, "unknown_session": UnknownSession, "limit_exceeded": LimitExceeded,
           "invalid": InvalidRequest, "session_finished": RemoteSessionFinished,
           "session_busy": SessionBusy}.get(code, RemoteError)
    raise cls(msg, **kw)
