"""The served engine: ``server`` (EngineServer over FastAPI/uvicorn), ``app`` and ``store`` behind it,
``transport`` (connection bounds), ``wire`` (the versioned JSON both ends speak) and ``client``
(``wb.connect``: the standard library only, so it imports without the server's stack).

    server = EngineServer(wb.load(), port=0)      # binds 127.0.0.1 on a free port, makes a token
    server.start(); remote = wb.connect(server.url, token=server.token); server.stop()
"""
from __future__ import annotations

_SERVER_NAMES = ("EngineServer", "Limits", "MIN_TOKEN_CHARS", "ServeError", "SessionStore", "is_loopback",
                 "new_token", "check_token")


def __getattr__(name: str):
    """The server's names import FastAPI and uvicorn on first use (a one-line ImportError names the extra)."""
    if name in _SERVER_NAMES:
        from workbench.serve import server

        return getattr(server, name)
    raise AttributeError(f"module 'workbench.serve' has no attribute {name!r}")


__all__ = list(_SERVER_NAMES)
