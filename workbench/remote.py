"""``wb.connect(url, token=...)``: a served engine with the local Engine / Session API (standard library HTTP).

    remote = wb.connect("http://127.0.0.1:8765", token="...")
    s = remote.session("def parse(line):", policy=wb.DDTree(32))
    c = s.step()                     # a wb.Cycle, equal to the one a local engine returns
    s.id                             # keep it: after a kernel restart, remote.session_by_id(s.id)

Cycles and traces are the same dataclasses as local ones, rebuilt from the wire format
(docs/wire-format.md); views, the Stepper and the shapes tables take a remote session as is.
"""
from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import torch

from workbench import wire
from workbench.cycle import Cycle, Trace
from workbench.engine import DEFAULT_MAX_NEW_TOKENS, SessionFinished, SessionState
from workbench.policies import DDTree, Policy, as_policy
from workbench.sampling import Sampling
from workbench.wire import WIRE_VERSION, WireVersionError

__all__ = ["InvalidRequest", "LimitExceeded", "RemoteEngine", "RemoteError", "RemoteSession", "RemoteSessionFinished",
           "Unauthorized", "UnknownSession", "WireVersionError", "connect"]


class RemoteError(RuntimeError):
    """The server refused a request: ``status`` (HTTP), ``code``, and the ``field`` / ``limit`` it names."""

    def __init__(self, message: str, status: int = 0, code: str = "", field: str | None = None,
                 limit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.field, self.limit = status, code, field, limit


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


def _raise_for(status: int, body) -> None:
    if not isinstance(body, dict) or "error" not in body:
        raise RemoteError(f"HTTP {status} from the server: {str(body)[:200]}", status)
    code, msg = body["error"], body.get("message", "")
    kw = dict(status=status, code=code, field=body.get("field"), limit=body.get("limit"))
    if code == "wire_version":
        raise WireVersionError(msg)
    cls = {"unauthorized": Unauthorized, "unknown_session": UnknownSession, "limit_exceeded": LimitExceeded,
           "invalid": InvalidRequest, "session_finished": RemoteSessionFinished}.get(code, RemoteError)
    raise cls(msg, **kw)


class _Http:
    def __init__(self, url: str, token: str, timeout: float):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url={url!r} is not an http(s) URL such as 'http://127.0.0.1:8765'")
        self.url, self.timeout = url.rstrip("/"), timeout
        self.headers = {"Authorization": f"Bearer {token}", wire.VERSION_HEADER: str(WIRE_VERSION),
                        "Content-Type": "application/json"}
        # A proxy from the environment must not see a loopback token (nor fail to reach 127.0.0.1).
        handlers = [urllib.request.ProxyHandler({})] if wire.is_loopback(parts.hostname) else []
        self.opener = urllib.request.build_opener(*handlers)

    def __call__(self, method: str, path: str, body: dict | None = None):
        data = wire.dumps(body) if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=self.headers)
        try:
            with self.opener.open(req, timeout=self.timeout) as r:
                return wire.loads(r.read())
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                body = wire.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
            _raise_for(e.code, body)
        except urllib.error.URLError as e:
            raise ConnectionError(f"cannot reach the workbench server at {self.url}: {e.reason}") from None


def connect(url: str, token: str | None = None, *, token_file=None, timeout: float = 600.0) -> "RemoteEngine":
    """Attach to ``python -m workbench serve``. The token: ``token=``, else ``token_file=``, else $WORKBENCH_TOKEN."""
    if token is None and token_file is not None:
        token = Path(token_file).read_text().strip()
    token = token or os.environ.get("WORKBENCH_TOKEN")
    if not token:
        raise ValueError("no token: pass token=... (printed by `python -m workbench serve`), token_file=, "
                         "or set WORKBENCH_TOKEN")
    return RemoteEngine(_Http(url, token, timeout))


class RemoteEngine:
    """A served engine: ``session()``, ``session_by_id()``, ``sessions()``, ``generate()``, ``tokenizer``, ``info``."""

    def __init__(self, http: _Http):
        self._http = http
        self.info: dict = http("GET", "/info")
        theirs = self.info.get("wire_version")
        if theirs != WIRE_VERSION:
            raise WireVersionError(wire.version_mismatch(WIRE_VERSION, theirs))
        self.kernel_backend: str = self.info["kernel_backend"]
        self._tokenizer = None

    @property
    def url(self) -> str:
        return self._http.url

    @property
    def device(self) -> torch.device:
        """The server's device (where the models run)."""
        return torch.device(self.info["device"])

    @property
    def limits(self) -> dict:
        return dict(self.info["limits"])

    @property
    def tokenizer(self):
        """The server's tokenizer, rebuilt here from its files (fetched once)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            files = self._http("GET", "/tokenizer")["files"]
            with tempfile.TemporaryDirectory() as d:
                for name, text in files.items():
                    (Path(d) / Path(name).name).write_text(text)
                self._tokenizer = AutoTokenizer.from_pretrained(d, local_files_only=True)
        return self._tokenizer

    def health(self) -> dict:
        return self._http("GET", "/health")

    def sessions(self) -> list[dict]:
        """The server's live sessions (id, prompt, policy, cycles, idle seconds), from every client."""
        return self._http("GET", "/sessions")["sessions"]

    def session(self, prompt: str, policy: Policy = DDTree(32), temperature: float = 0.0, top_p: float = 1.0,
                top_k: int = 0, seed: int = 0, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                kernel_backend: str | None = None, record_topk: int = 8, capture=None) -> "RemoteSession":
        """Start a generation on the server (runs the prefill there). ``capture=True`` records module shapes."""
        body = {"prompt": prompt, "policy": wire.policy_to_wire(as_policy(policy)), "temperature": temperature,
                "top_p": top_p, "top_k": top_k, "seed": seed, "max_new_tokens": max_new_tokens,
                "kernel_backend": kernel_backend, "record_topk": record_topk, "capture": bool(capture)}
        return RemoteSession(self, self._http("POST", "/sessions", body))

    def session_by_id(self, session_id: str) -> "RemoteSession":
        """Re-attach to a live session (after a kernel restart, or from another notebook): its whole trace."""
        return RemoteSession(self, self._http("GET", f"/sessions/{_sid(session_id)}?since=0"))

    def generate(self, prompt: str, policy: Policy = DDTree(32), max_new_tokens: int = 64, **kw) -> Trace:
        s = self.session(prompt, policy, max_new_tokens=max_new_tokens, **kw)
        try:
            return s.run()
        finally:
            s.close()

    def __repr__(self) -> str:
        return f"RemoteEngine({self.url}: {self.info.get('engine', '?')})"


def _sid(session_id) -> str:
    s = str(session_id)
    if not s or not all(c.isalnum() or c in "-_" for c in s):
        raise ValueError(f"session id {session_id!r} is not a session id (letters, digits, - and _)")
    return s


class RemoteSession(SessionState):
    """A session living on the server; the same attributes and methods as a local ``Session``.

    ``trace`` is kept here and grows with every reply, so figures read it without a request.
    ``kv_cache()`` gives the server cache's shapes as ``meta`` tensors (no data crosses the wire).
    """

    def __init__(self, engine: RemoteEngine, state: dict):
        self.engine = engine
        self.id: str = state["id"]
        self.trace: Trace = wire.trace_from_wire(state["trace"])
        self._apply(state)

    # ---------------------------------------------------------------- the server's state
    def _apply(self, st: dict) -> None:
        since = int(st["since"])
        cycles = self.trace.cycles
        if since > len(cycles):  # should not happen; fetch what is missing
            return self._apply(self.engine._http("GET", f"/sessions/{self.id}?since={len(cycles)}"))
        del cycles[since:]
        cycles.extend(wire.cycles_from_wire(st["cycles"]))
        wire.copy_trace_head(wire.trace_from_wire(st["trace"]), self.trace)
        self.prompt: str = st["prompt"]
        self.prompt_ids: list[int] = list(st["prompt_ids"])
        self._policy = wire.policy_from_wire(st["policy"])
        self.sampling = Sampling(st["temperature"], st["top_p"], st["top_k"])
        self.seed, self.max_new_tokens = st["seed"], st["max_new_tokens"]
        self.kernel_backend, self.record_topk = st["kernel_backend"], st["record_topk"]
        self._capture = bool(st["capture"])
        self.generated: list[int] = list(st["generated"])
        self._text: str = st["text"]
        self.finish_reason: str | None = st["finish_reason"]
        self._kv_shapes = st["kv_shapes"]

    def _call(self, method: str, path: str = "", body: dict | None = None) -> None:
        self._apply(self.engine._http(method, f"/sessions/{self.id}{path}", body))

    def refresh(self) -> "RemoteSession":
        """Fetch cycles run by other clients of this session."""
        self._call("GET", f"?since={len(self.trace.cycles)}")
        return self

    # ---------------------------------------------------------------- settings for the next cycle
    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, p) -> None:
        self._call("PATCH", "", {"policy": wire.policy_to_wire(as_policy(p))})

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    @temperature.setter
    def temperature(self, t: float) -> None:
        Sampling(t, self.sampling.top_p, self.sampling.top_k)  # the local check and message first
        self._call("PATCH", "", {"temperature": float(t)})

    @property
    def capture(self):
        """True while the server records per-module shapes for each forward (None otherwise)."""
        return True if self._capture else None

    @capture.setter
    def capture(self, on) -> None:
        self._call("PATCH", "", {"capture": bool(on)})

    # ---------------------------------------------------------------- state, as a local Session has it
    @property
    def text(self) -> str:
        return self._text

    @property
    def full_text(self) -> str:
        return self.prompt + self._text

    def kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The server's target cache as (keys, values) per layer: ``meta`` tensors of the right shapes."""
        return [(torch.empty(k, device="meta"), torch.empty(v, device="meta")) for k, v in self._kv_shapes]

    def __repr__(self) -> str:
        state = f"finished: {self.finish_reason}" if self.finished else "running"
        return (f"RemoteSession({self.id}: {self.policy}, T={self.sampling.temperature}, {len(self.cycles)} cycles, "
                f"{len(self.generated)} new tokens, {state})")

    # ---------------------------------------------------------------- running
    def step(self) -> Cycle:
        """Run one cycle on the server and return its record."""
        self._call("POST", "/step", {"since": len(self.trace.cycles)})
        return self.trace.cycles[-1]

    def run(self, max_new_tokens: int | None = None) -> Trace:
        """Step until end-of-text or ``max_new_tokens`` generated in all; other sessions' cycles interleave."""
        self._call("POST", "/run", {"since": len(self.trace.cycles), "max_new_tokens": max_new_tokens})
        return self.trace

    def close(self) -> None:
        """Drop the session on the server (its memory is returned); idle sessions also expire by themselves."""
        self.engine._http("DELETE", f"/sessions/{self.id}")
