"""``wb.connect(url, token=...)``: a served engine with the local Engine / Session API (standard library HTTP).

    remote = wb.connect("http://127.0.0.1:8765", token="...")
    s = remote.session("def parse(line):", policy=wb.DDTree(32))
    c = s.step()                     # a wb.Cycle, equal to the one a local engine returns
    s.id                             # keep it: after a kernel restart, remote.session_by_id(s.id)

Cycles and traces are the same dataclasses as local ones, rebuilt from the wire format
(docs/wire-format.md); views, the Stepper and the shapes tables take a remote session as is.
A re-attached session fetches its trace when first read, in pages of bounded size. The client
sends the token only to the URL it was given: it never follows a redirect, never goes through
a proxy to a loopback server, and refuses plain http to another machine unless told.
"""
from __future__ import annotations

import operator
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import torch

from workbench.serve import wire
from workbench.records.cycle import Cycle, Trace
from workbench.engine.core import SessionFinished, SessionState
from workbench.engine import validate
from workbench.engine.policies import DDTree, Policy, as_policy
from workbench.engine.sampling import Sampling
from workbench.interface.base import BaseEngine, BaseSession, EngineLacks
from workbench.serve.wire import WIRE_VERSION, WireVersionError

__all__ = ["InvalidRequest", "LimitExceeded", "RemoteEngine", "RemoteError", "RemoteSession", "RemoteSessionFinished",
           "SessionBusy", "Unauthorized", "UnknownSession", "WireVersionError", "connect"]


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


def _raise_for(status: int, body) -> None:
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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is refused: following it would send the bearer token to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        fp.close()
        raise RemoteError(f"the server at {req.full_url} answered {code} with a redirect to {wire.short(newurl)}; "
                          "the workbench client never follows redirects (the token would go along): connect to "
                          "the engine's own URL", code, "redirect")


class _Http:
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
        self.headers = {"Authorization": f"Bearer {token}", wire.VERSION_HEADER: str(WIRE_VERSION),
                        "Content-Type": "application/json"}
        self.max_body: int | None = None  # the server's max_body_bytes, once /info has told it
        # A proxy from the environment must not see a loopback token (nor fail to reach 127.0.0.1).
        handlers = [urllib.request.ProxyHandler({})] if loopback else []
        self.opener = urllib.request.build_opener(*handlers, _NoRedirect())

    def __call__(self, method: str, path: str, body: dict | None = None):
        data = wire.dumps(body) if body is not None else None
        if data is not None and self.max_body is not None and len(data) > self.max_body:
            raise LimitExceeded(f"this request's body is {len(data)} bytes, over the server's max_body_bytes="
                                f"{self.max_body} (a prompt that long cannot fit the model); shorten it, or start "
                                "the server with --max-body-bytes N", 413, "limit_exceeded", "body", "max_body_bytes")
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


def connect(url: str, token: str | None = None, *, token_file=None, timeout: float = 600.0,
            insecure_http: bool = False) -> "RemoteEngine":
    """Attach to ``python -m workbench serve``. The token: ``token=``, else ``token_file=``, else $WORKBENCH_TOKEN.
    ``insecure_http=True`` allows plain http to a host other than this machine (the token travels in clear)."""
    if not isinstance(insecure_http, bool):  # "no" is truthy: it would lift the refusal and send the token in clear
        raise ValueError(f"insecure_http={insecure_http!r} must be True or False")
    if token is not None and token_file is not None:
        raise ValueError("give one of token= or token_file=, not both (which one to send would be a guess)")
    if token is None and token_file is not None:
        token = Path(token_file).read_text().strip()
    token = token or os.environ.get("WORKBENCH_TOKEN")
    if not token:
        raise ValueError("no token: pass token=... (printed by `python -m workbench serve`), token_file=, "
                         "or set WORKBENCH_TOKEN")
    return RemoteEngine(_Http(url, token, timeout, insecure_http))


class RemoteEngine(BaseEngine):
    """A served engine: ``session()``, ``session_by_id()``, ``sessions()``, ``generate()``, ``tokenizer``, ``info``.
    The engine interface of ``workbench.interface.base``, reached over HTTP (``wb.connect``, not ``wb.load``)."""

    name = "served"
    instead = {"batch_session": "the server runs one session per request; start several sessions, or use a "
                                "local engine (wb.load) for a batch"}

    @classmethod
    def load(cls, target=None, draft=None, **options) -> "RemoteEngine":
        raise EngineLacks("a served engine is not loaded in this process: start one with `python -m workbench "
                          "serve` and connect with wb.connect(url, token=...)")

    def __init__(self, http: _Http):
        self._http = http
        self.info: dict = http("GET", "/info")
        theirs = self.info.get("wire_version")
        if theirs != WIRE_VERSION:
            raise WireVersionError(wire.version_mismatch(WIRE_VERSION, theirs))
        http.max_body = self.info["limits"].get("max_body_bytes")
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

    def session(self, prompt: str | None = None, policy: Policy = DDTree(32), temperature: float = 0.0,
                top_p: float = 1.0, top_k: int = 0, seed: int = 0, max_new_tokens: int | None = None,
                kernel_backend: str | None = None, record_topk: int = 8, capture=None, *, messages=None,
                prompt_ids=None, static_shapes: bool | None = None) -> "RemoteSession":
        """Start a generation on the server (runs the prefill there), with engine.session's arguments: one of
        ``prompt``, ``messages`` or ``prompt_ids``; ``static_shapes``. ``capture=True`` records module shapes.
        ``max_new_tokens=None``: the engine's default (DEFAULT_MAX_NEW_TOKENS), capped by the server's limit."""
        Sampling(temperature, top_p, top_k), validate.seed(seed)  # the local checks and messages first
        body = {"prompt": prompt, "policy": wire.policy_to_wire(as_policy(policy)), "temperature": temperature,
                "top_p": top_p, "top_k": top_k, "seed": seed,
                **({} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}), "kernel_backend": kernel_backend, "record_topk": record_topk, "capture": bool(capture)}
        if messages is not None:
            body["messages"] = messages
        if prompt_ids is not None:
            body["prompt_ids"] = _ids(prompt_ids)
        if static_shapes is not None:
            body["static_shapes"] = static_shapes
        return RemoteSession(self, self._http("POST", "/sessions", body))

    def replay(self, trace: Trace, **kw) -> "RemoteSession":
        """A new session on the server that re-runs ``trace`` (its prompt ids, settings and recorded changes),
        as ``Engine.replay`` does locally."""
        from workbench.engine.session import replay

        return replay(self, trace, **kw)

    def session_by_id(self, session_id: str) -> "RemoteSession":
        """Re-attach to a live session (after a kernel restart, or from another notebook). Its state comes now;
        its trace is fetched when first read (``s.trace``, ``s.cycles``, a step), in pages of bounded size."""
        return RemoteSession(self, self._http("GET", f"/sessions/{_sid(session_id)}?since=0&until=0"))

    def generate(self, prompt: str | None = None, policy: Policy = DDTree(32),
                 max_new_tokens: int | None = None, **kw) -> Trace:
        """Run a whole session on the server and return its trace (as ``Engine.generate``)."""
        s = self.session(prompt, policy, max_new_tokens=max_new_tokens, **kw)
        try:
            return s.run()
        finally:
            s.close()

    def __repr__(self) -> str:
        return f"RemoteEngine({self.url}: {self.info.get('engine', '?')})"

    # What a local Engine has and a served one cannot give: refused in one line, not a bare AttributeError.
    _LOCAL_ONLY = {
        "encode": "encode with remote.tokenizer, or pass messages=/prompt_ids= to remote.session",
        "models": "the models live in the server's process; remote.info['models'] describes them",
        "graphs": "CUDA graphs are the server's (serve --cuda-graphs is not offered)",
    }

    def __getattr__(self, name: str):
        why = RemoteEngine._LOCAL_ONLY.get(name)
        if why is None:
            raise AttributeError(f"'RemoteEngine' object has no attribute {name!r}")
        raise AttributeError(f"RemoteEngine.{name} is not served: {why}")


def _ids(prompt_ids) -> list:
    """Token ids as JSON can carry them (a tensor or numpy array as a list of ints)."""
    if hasattr(prompt_ids, "tolist") and not isinstance(prompt_ids, list):
        prompt_ids = prompt_ids.tolist()
    if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__iter__"):
        raise ValueError(f"prompt_ids={prompt_ids!r:.80} must be a list of token ids")
    out = []
    for n, i in enumerate(prompt_ids):
        try:
            if isinstance(i, bool):
                raise TypeError
            out.append(operator.index(i))
        except TypeError:  # the local engine's line (1.5 is not truncated to 1)
            raise ValueError(f"prompt_ids[{n}]={i!r:.40} is not a token id; give integers") from None
    return out


def _sid(session_id) -> str:
    s = str(session_id)
    if not s or not all(c.isalnum() or c in "-_" for c in s):
        raise ValueError(f"session id {session_id!r} is not a session id (letters, digits, - and _)")
    return s


class RemoteSession(SessionState, BaseSession):
    """A session living on the server; the same attributes and methods as a local ``Session``.

    ``trace`` is kept here and grows with every reply, so figures read it without a request (once it
    holds every cycle the server has: a reply carries a page of cycles, and the rest is fetched when
    ``trace`` is read). ``kv_cache()`` gives the server cache's shapes as ``meta`` tensors.
    """

    def __init__(self, engine: RemoteEngine, state: dict):
        self.engine = engine
        self.id: str = state["id"]
        self._trace: Trace = wire.trace_from_wire(state["trace"])
        self._n_cycles = 0  # cycles the server has; self._trace holds the first len(cycles) of them
        self._apply(state)

    @property
    def trace(self) -> Trace:
        """The whole trace; cycles this client has not seen yet are fetched first, a page per request."""
        cycles = self._trace.cycles
        while len(cycles) < self._n_cycles:
            held = len(cycles)
            self._call("GET", f"?since={held}")
            if len(cycles) <= held:
                raise RemoteError(f"the server sent no cycles from index {held} of {self._n_cycles}", 0, "internal")
        return self._trace

    # ---------------------------------------------------------------- the server's state
    def _apply(self, st: dict) -> None:
        since = int(st["since"])
        cycles = self._trace.cycles
        if since <= len(cycles):  # (a page past what is held is not kept: ``trace`` fetches from the gap)
            del cycles[since:]
            cycles.extend(wire.cycles_from_wire(st["cycles"]))
        self._n_cycles = int(st["n_cycles"])
        wire.copy_trace_head(wire.trace_from_wire(st["trace"]), self._trace)
        self.prompt: str = st["prompt"]
        self.prompt_ids: list[int] = list(st["prompt_ids"])
        self._policy = wire.policy_from_wire(st["policy"])
        self.sampling = Sampling(st["temperature"], st["top_p"], st["top_k"])
        self._seed, self._max_new_tokens = st["seed"], st["max_new_tokens"]
        self._kernel_backend, self._record_topk = st["kernel_backend"], st["record_topk"]
        self._capture = bool(st["capture"])
        self.generated: list[int] = list(st["generated"])
        self._text: str = st["text"]
        self.finish_reason: str | None = st["finish_reason"]
        self._kv_shapes = st["kv_shapes"]

    def _call(self, method: str, path: str = "", body: dict | None = None) -> None:
        try:
            st = self.engine._http(method, f"/sessions/{self.id}{path}", body)
        except RemoteError as e:
            if e.state is not None:  # a run the server stopped: the cycles it ran are kept, then the error
                self._apply(e.state)
            raise
        self._apply(st)

    def refresh(self) -> "RemoteSession":
        """Fetch cycles run by other clients of this session."""
        self._call("GET", f"?since={len(self.trace.cycles)}")
        self.trace  # noqa: B018 - and the pages after the first
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
    def top_p(self) -> float:
        return self.sampling.top_p

    @top_p.setter
    def top_p(self, p: float) -> None:
        Sampling(self.sampling.temperature, p, self.sampling.top_k)
        self._call("PATCH", "", {"top_p": float(p)})

    @property
    def top_k(self) -> int:
        return self.sampling.top_k

    @top_k.setter
    def top_k(self, k: int) -> None:
        Sampling(self.sampling.temperature, self.sampling.top_p, k)
        self._call("PATCH", "", {"top_k": k})

    @property
    def seed(self) -> int:
        return self._seed

    @seed.setter
    def seed(self, s: int) -> None:
        """Re-seed the server's sampler for this session: the next cycle's draws come from ``s``."""
        self._call("PATCH", "", {"seed": validate.seed(s)})

    @property
    def max_new_tokens(self) -> int:
        return self._max_new_tokens

    @max_new_tokens.setter
    def max_new_tokens(self, n: int) -> None:
        validate.positive_int(n, "max_new_tokens")
        self._call("PATCH", "", {"max_new_tokens": n})

    @property
    def kernel_backend(self) -> str:
        return self._kernel_backend

    @kernel_backend.setter
    def kernel_backend(self, _v) -> None:
        raise AttributeError("kernel_backend is fixed when a remote session starts: give it to "
                             "remote.session(..., kernel_backend=...)")

    @property
    def record_topk(self) -> int:
        return self._record_topk

    @record_topk.setter
    def record_topk(self, _v) -> None:
        raise AttributeError("record_topk is fixed when a remote session starts: give it to "
                             "remote.session(..., record_topk=N)")

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

    def cache_bytes(self):
        raise NotImplementedError("cache_bytes() is not served per session; remote.health()['session_kv_bytes'] gives "
                             "the server's total")

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
        self._call("POST", "/step", {"since": len(self._trace.cycles)})
        return self.trace.cycles[-1]

    def run(self, max_new_tokens: int | None = None) -> Trace:
        """Step until end-of-text or ``max_new_tokens`` generated in all; other sessions' cycles interleave.
        If the server stops meanwhile, the cycles it ran are in ``trace`` and RemoteError (``stopping``) is raised."""
        self._call("POST", "/run", {"since": len(self._trace.cycles), "max_new_tokens": max_new_tokens})
        return self.trace

    def close(self) -> None:
        """Drop the session on the server (its memory is returned); idle sessions also expire by themselves."""
        self.engine._http("DELETE", f"/sessions/{self.id}")
