"""The served client's HTTP: JSON requests and NDJSON streams to one server, with its token.

The client sends the token only to the URL it was given: it never follows a redirect, never goes through
a proxy to a loopback server, and refuses plain http to another machine unless told. Connections are
``workbench.serve.connection``'s; a refusal is raised as ``workbench.serve.client_errors``' classes.
"""
from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from workbench.serve import wire
from workbench.serve.client_errors import LimitExceeded, RemoteError, raise_for
from workbench.serve.connection import Connections, Reply

class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is refused: following it would send the bearer token to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        fp.close()
        raise redirect_refused(req.full_url, code, newurl)


def redirect_refused(url: str, code: int, where) -> RemoteError:
    return RemoteError(f"the server at {url} answered {code} with a redirect to {wire.short(where)}; the workbench "
                       "client never follows redirects (the token would go along): connect to the engine's own URL",
                       code, "redirect")


class Http:
    """JSON requests (``__call__``) and NDJSON streams (``stream``) to one server, with the token."""

    def __init__(self, url: str, token: str, timeout: float, insecure_http: bool = False):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url={wire.short(url)} is not an http(s) URL such as 'http://127.0.0.1:8765'")
        loopback = wire.is_loopback(parts.hostname)
        if parts.scheme == "http" and not loopback and not insecure_http:
            raise ValueError(f"url={wire.short(url)}: plain http to {parts.hostname}, another machine, would send the "
                             "token and every prompt unencrypted; tunnel it (ssh -L 8765:127.0.0.1:8765 HOST, then "
                             "connect to http://127.0.0.1:8765), use https://, or pass insecure_http=True")
        self.url, self.timeout = url.rstrip("/"), timeout
        self.headers = {"Authorization": f"Bearer {token}", wire.VERSION_HEADER: str(wire.WIRE_VERSION),
                        "Content-Type": "application/json"}
        self.max_body: int | None = None  # the server's max_body_bytes, once /info has told it
        # A proxy from the environment must not see a loopback token (nor fail to reach 127.0.0.1); a loopback
        # server is also where connections are kept open between requests (workbench.serve.connection).
        handlers = [urllib.request.ProxyHandler({})] if loopback else []
        opener = urllib.request.build_opener(*handlers, NoRedirect())
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"url={wire.short(url)} has a port that is not a number from 0 to 65535") from None
        self.conns = Connections(parts.scheme, parts.hostname, port, parts.path.rstrip("/"), timeout, loopback,
                                 opener)

    def send(self, method: str, path: str, body: dict | None) -> Reply:
        """The request, sent; a refusal (4xx, 5xx) or a redirect raised as the client's errors."""
        data = wire.dumps(body) if body is not None else None
        if data is not None and self.max_body is not None and len(data) > self.max_body:
            raise LimitExceeded(f"this request's body is {len(data)} bytes, over the server's max_body_bytes="
                                f"{self.max_body} (a prompt that long cannot fit the model); shorten it, or start "
                                "the server with --max-body-bytes N", 413, "limit_exceeded", "body", "max_body_bytes")
        try:
            r = self.conns.send(method, path, data, self.headers)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            if isinstance(e, RemoteError):
                raise
            why = getattr(e, "reason", None) or e
            raise ConnectionError(f"cannot reach the workbench server at {self.url}: {why}") from None
        if 300 <= r.status < 400:
            r.close()
            raise redirect_refused(self.url + path, r.status, r.headers.get("Location"))
        if r.status >= 400:
            raw = r.read()
            try:
                answer = wire.loads(raw)
            except ValueError:
                answer = raw.decode(errors="replace")
            raise_for(r.status, answer)
        return r

    def answers(self, timeout: float = 2.0) -> bool:
        """Whether the server answers at all now: a ``/health`` request on a connection of its own, within
        ``timeout`` seconds (a refusal is an answer)."""
        req = urllib.request.Request(self.url + "/health", headers=self.headers)
        try:
            self.conns.opener.open(req, timeout=timeout).close()
        except urllib.error.HTTPError:
            return True
        except (OSError, http.client.HTTPException, RemoteError):
            return False
        return True

    def __call__(self, method: str, path: str, body: dict | None = None):
        r = self.send(method, path, body)
        try:
            return wire.loads(r.read())
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionError(f"the workbench server at {self.url} broke off its answer: {e}") from None
        finally:
            r.close()

    def stream(self, method: str, path: str, body: dict | None = None):
        """The lines of a streamed answer, each one JSON object, as they arrive."""
        r = self.send(method, path, body)
        try:
            while True:
                try:
                    line = r.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise ConnectionError(f"the workbench server at {self.url} broke off its stream: {e}") from None
                if not line:
                    r.close(complete=True)
                    return
                if line.strip():
                    yield wire.loads(line)
        finally:
            r.close()
