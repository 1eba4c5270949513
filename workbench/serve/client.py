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

import os
import tempfile
import time
from pathlib import Path

import torch

from workbench.serve import wire
from workbench.records.cycle import Cycle, Trace
from workbench.engine.core import SessionState
from workbench.engine import validate
from workbench.engine.policies import DDTree, Policy, as_policy
from workbench.engine.sampling import Sampling
from workbench.interface.base import BaseEngine, BaseSession, EngineLacks
from workbench.serve.client_errors import (InvalidRequest, LimitExceeded, RemoteError, RemoteSessionFinished,
                                           SessionBusy, Unauthorized, UnknownSession, raise_for)
from workbench.serve.client_http import Http
from workbench.serve.lazy_cycle import LazyCycle
from workbench.serve import token_file as token_files
from workbench.serve.wire import WIRE_VERSION, WireVersionError

__all__ = ["InvalidRequest", "LimitExceeded", "RemoteEngine", "RemoteError", "RemoteSession", "RemoteSessionFinished",
           "SessionBusy", "Unauthorized", "UnknownSession", "WireVersionError", "connect"]


def connect(url: str, token: str | None = None, *, token_file=None, timeout: float = 600.0,
            insecure_http: bool = False, timing: bool = False) -> "RemoteEngine":
    """Attach to ``python -m workbench serve``. The token: ``token=``, else ``token_file=``, else $WORKBENCH_TOKEN.
    ``insecure_http=True`` allows plain http to a host other than this machine (the token travels in clear).
    ``timing=True``: every session keeps, per cycle received, where its time went (``RemoteSession.timings``)."""
    for name, v in (("insecure_http", insecure_http), ("timing", timing)):
        if not isinstance(v, bool):  # "no" is truthy: it would lift the refusal and send the token in clear
            raise ValueError(f"{name}={v!r} must be True or False")
    if token is not None and token_file is not None:
        raise ValueError("give one of token= or token_file=, not both (which one to send would be a guess)")
    if token is None and token_file is not None:
        token = token_files.read(token_file)  # refused as the server refuses it: readable by others
    token = token or os.environ.get("WORKBENCH_TOKEN")
    if not token:
        raise ValueError("no token: pass token=... (printed by `python -m workbench serve`), token_file=, "
                         "or set WORKBENCH_TOKEN")
    return RemoteEngine(Http(url, token, timeout, insecure_http), timing=timing)


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

    def __init__(self, http: Http, timing: bool = False):
        self._http = http
        self.timing = timing  # sessions record where each cycle's time went (RemoteSession.timings)
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
                prompt_ids=None, static_shapes: bool | None = None, records: str = "view",
                hooks=None) -> "RemoteSession":
        """Start a generation on the server (runs the prefill there), with engine.session's arguments: one of
        ``prompt``, ``messages`` or ``prompt_ids``; ``static_shapes``. ``capture=True`` records module shapes.
        ``max_new_tokens=None``: the engine's default (DEFAULT_MAX_NEW_TOKENS), capped by the server's limit.
        ``records``: what each cycle carries as it arrives: ``"view"`` (what the views read; the drafter's
        top-k, the target's top-2 logits and the forward records come from the server when first read, while
        the session lives) or ``"full"`` (every field at once). ``hooks``: refused (the cycles run on the server)."""
        if hooks is not None:
            raise no_hooks("remote.session(..., hooks=)")
        Sampling(temperature, top_p, top_k), validate.seed(seed)  # the local checks and messages first
        wire.check_records(records)
        body = {"prompt": prompt, "policy": wire.policy_to_wire(as_policy(policy)), "temperature": temperature,
                "top_p": top_p, "top_k": top_k, "seed": seed,
                **({} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}), "kernel_backend": kernel_backend, "record_topk": record_topk, "capture": bool(capture)}
        if messages is not None:
            body["messages"] = messages
        if prompt_ids is not None:
            body["prompt_ids"] = _ids(prompt_ids)
        if static_shapes is not None:
            body["static_shapes"] = static_shapes
        return RemoteSession(self, self._http("POST", "/sessions", body), records)

    def replay(self, trace: Trace, **kw) -> "RemoteSession":
        """A new session on the server that re-runs ``trace`` (its prompt ids, settings and recorded changes),
        as ``Engine.replay`` does locally."""
        from workbench.engine.session import replay

        return replay(self, trace, **kw)

    def session_by_id(self, session_id: str, records: str = "view") -> "RemoteSession":
        """Re-attach to a live session (after a kernel restart, or from another notebook). Its state comes now;
        its trace is fetched when first read (``s.trace``, ``s.cycles``, a step), in pages of bounded size."""
        wire.check_records(records)
        return RemoteSession(self, self._http("GET", f"/sessions/{_sid(session_id)}?since=0&until=0"), records)

    def generate(self, prompt: str | None = None, policy: Policy = DDTree(32),
                 max_new_tokens: int | None = None, **kw) -> Trace:
        """Run a whole session on the server and return its trace (as ``Engine.generate``): every record whole,
        since the session is closed before the trace is returned."""
        kw.setdefault("records", "full")
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


def no_hooks(what: str) -> EngineLacks:
    """The one line refusing a hook argument of a served session: its cycles run in the server's process."""
    return EngineLacks(f"{what}: a served session takes no hooks; its cycles run in the server's process, where "
                       "a function of yours cannot go; hook a local session (wb.load(...)) of the same pair")


def _ids(prompt_ids) -> list:
    """Token ids as JSON can carry them (a tensor or numpy array as a list of ints), refused in the local
    engine's line (``validate.token_ids``: 1.5 is not truncated to 1) before anything is sent."""
    if hasattr(prompt_ids, "tolist") and not isinstance(prompt_ids, list):
        prompt_ids = prompt_ids.tolist()
    return validate.token_ids(prompt_ids)


def _sid(session_id) -> str:
    s = str(session_id)
    if not s or not all(c.isalnum() or c in "-_" for c in s):
        raise ValueError(f"session id {session_id!r} is not a session id (letters, digits, - and _)")
    return s


class RemoteSession(SessionState, BaseSession):
    """A session living on the server; the same attributes and methods as a local ``Session``.

    ``trace`` is kept here and grows with every reply, so figures read it without a request (once it
    holds every cycle the server has: a reply carries a page of cycles, and the rest is fetched when
    ``trace`` is read). Cycles arrive as view records by default (``records="view"``): the fields a view
    does not read come from the server when first read (``workbench.serve.lazy_cycle``). ``kv_cache()``
    gives the server cache's shapes as ``meta`` tensors. With ``wb.connect(..., timing=True)``,
    ``timings`` holds, per cycle received, where its time went.
    """

    def __init__(self, engine: RemoteEngine, state: dict, records: str = "view"):
        self.engine = engine
        self.id: str = state["id"]
        self._records = wire.check_records(records)
        self._trace: Trace = wire.trace_from_wire(state["trace"])
        self._n_cycles = 0  # cycles the server has; self._trace holds the first len(cycles) of them
        self._text, self.generated = "", []
        self.timings: list[dict] = []  # with timing on: per cycle received, where its time went (seconds)
        self._apply(state)

    @property
    def records(self) -> str:
        """What the cycles of the next replies carry: "view" (the rest fetched when read) or "full"."""
        return self._records

    @records.setter
    def records(self, records: str) -> None:
        self._records = wire.check_records(records)

    @property
    def trace(self) -> Trace:
        """The whole trace; cycles this client has not seen yet are fetched first, a page per request."""
        cycles = self._trace.cycles
        while len(cycles) < self._n_cycles:
            held = len(cycles)
            self._call("GET", f"?since={held}&records={self._records}")
            if len(cycles) <= held:
                raise RemoteError(f"the server sent no cycles from index {held} of {self._n_cycles}", 0, "internal")
        return self._trace

    # ---------------------------------------------------------------- the server's state
    def _held(self) -> dict:
        """What this client holds, so that a reply carries only the rest (docs/wire-format.md)."""
        return {"since": len(self._trace.cycles), "have_tokens": len(self.generated), "revision": self._revision,
                "records": self._records}

    def _decode(self, d: dict) -> Cycle:
        return wire.cycle_from_wire(d, self._complete)

    def _apply(self, st: dict, cycles: bool = True) -> None:
        if cycles:
            since = int(st["since"])
            held = self._trace.cycles
            if since <= len(held):  # (a page past what is held is not kept: ``trace`` fetches from the gap)
                del held[since:]
                for d in st["cycles"]:
                    self._trace.append(self._decode(d))  # as the server's trace appends it (its meta's lists)
        self._n_cycles = int(st["n_cycles"])
        gen_from, text_from = int(st["generated_from"]), int(st["text_from"])
        self.generated[gen_from:] = st["generated"]  # the tokens and text this client lacked
        self._text = self._text[:text_from] + st["text"]
        self.finish_reason: str | None = st["finish_reason"]
        self._trace.finish_reason, self._trace.new_tokens = st["finish_reason"], int(st["new_tokens"])
        if "trace" not in st:
            return  # what a cycle changes: the settings, the prompt and the header are as they were
        self._revision = int(st["revision"])
        wire.copy_trace_head(wire.trace_from_wire(st["trace"]), self._trace)
        self.prompt: str = st["prompt"]
        self.prompt_ids: list[int] = list(st["prompt_ids"])
        self._policy = wire.policy_from_wire(st["policy"])
        self.sampling = Sampling(st["temperature"], st["top_p"], st["top_k"])
        self._seed, self._max_new_tokens = st["seed"], st["max_new_tokens"]
        self._kernel_backend, self._record_topk = st["kernel_backend"], st["record_topk"]
        self._capture = bool(st["capture"])
        self._kv_shapes, self._kv_at = st["kv_shapes"], self._n_cycles

    def _call(self, method: str, path: str = "", body: dict | None = None) -> dict:
        try:
            st = self.engine._http(method, f"/sessions/{self.id}{path}", body)
        except RemoteError as e:
            if e.state is not None:  # a run the server stopped: the cycles it ran are kept, then the error
                self._apply(e.state)
            raise
        self._apply(st)
        return st

    def _complete(self, cycle: LazyCycle) -> None:
        """Fetch the whole records of cycles ``cycle.index``.. (a page) and fill ``cycle`` and the view records
        held for them."""
        held, index = self._trace.cycles, cycle.index
        try:
            st = self.engine._http("GET", f"/sessions/{self.id}?since={index}&until={max(len(held), index + 1)}"
                                   "&records=full")
        except UnknownSession as e:
            raise UnknownSession(f"{e}: cycle {index} arrived as a view record and the rest of it cannot be fetched "
                                 "now; read what you need before s.close() (or close with fetch=True), or start "
                                 "sessions with records='full'", e.status, e.code, e.field) from None
        for k, d in enumerate(st["cycles"]):
            at = int(st["since"]) + k
            full = wire.cycle_from_wire(d)
            for c in {id(x): x for x in (held[at] if at < len(held) else None, cycle if at == index else None)
                      if isinstance(x, LazyCycle)}.values():
                c.fill(full)
        self._apply(st, cycles=False)

    def refresh(self) -> "RemoteSession":
        """Fetch cycles run by other clients of this session."""
        self._call("GET", f"?since={len(self.trace.cycles)}&records={self._records}")
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
        """The server's target cache as (keys, values) per layer: ``meta`` tensors of the right shapes (asked
        for when the cycles have moved on since the shapes last came: a step's reply leaves them out)."""
        if self._kv_at != self._n_cycles:
            n = len(self._trace.cycles)
            self._call("GET", f"?since={n}&until={n}")
        return [(torch.empty(k, device="meta"), torch.empty(v, device="meta")) for k, v in self._kv_shapes]

    def __repr__(self) -> str:
        state = f"finished: {self.finish_reason}" if self.finished else "running"
        return (f"RemoteSession({self.id}: {self.policy}, T={self.sampling.temperature}, {len(self.cycles)} cycles, "
                f"{len(self.generated)} new tokens, {state})")

    # ---------------------------------------------------------------- running
    def step(self, hooks=None) -> Cycle:
        """Run one cycle on the server (one request) and return its record. ``hooks``: refused (see ``hooks``)."""
        if hooks is not None:
            raise no_hooks("s.step(hooks=)")
        body = self._held()
        if self.engine.timing:
            body["timing"] = True
        t0 = time.perf_counter()
        try:
            st = self.engine._http("POST", f"/sessions/{self.id}/step", body)
        except RemoteError as e:
            if e.state is not None:
                self._apply(e.state)
            raise
        t1 = time.perf_counter()
        self._apply(st)
        if self.engine.timing and st["cycles"]:
            self.timings.append({"index": len(self._trace.cycles) - 1, "at": time.perf_counter(), "request": t0,
                                 "round_trip": t1 - t0, "decode": time.perf_counter() - t1, **st.get("timing", {})})
        return self.trace.cycles[-1]

    def run(self, max_new_tokens: int | None = None) -> Trace:
        """Step until end-of-text or ``max_new_tokens`` generated in all; other sessions' cycles interleave.
        One request, whose cycles stream back as they are made (a stream that meets one of the server's
        per-stream bounds ends, and the next one carries on). If the server stops meanwhile, the cycles it
        ran are in ``trace`` and RemoteError (``stopping``) is raised."""
        body = {**self._held(), "max_new_tokens": max_new_tokens}
        while True:
            end = self._stream(body)
            if self.finished or end not in wire.STREAM_BOUNDS:
                return self.trace
            body = self._held()  # (the limit is set already)

    def hooks(self, *hooks):
        """Refused in one line: hook points run in the server's process."""
        raise no_hooks("s.hooks(...)")

    def run_with_hooks(self, max_new_tokens: int | None = None, hooks=()):
        """Refused in one line: hook points run in the server's process."""
        raise no_hooks("s.run_with_hooks(...)")

    def _stream(self, body: dict) -> str | None:
        """One /run stream, applied frame by frame. -> why it ended (the server's word)."""
        if self.engine.timing:
            body["timing"] = True
        held, last, since = self._trace.cycles, None, len(self._trace.cycles)
        try:
            for frame in self.engine._http.stream("POST", f"/sessions/{self.id}/run", body):
                if "cycle" in frame:
                    t0 = time.perf_counter()
                    c = self._decode(frame["cycle"])
                    if c.index != len(held):  # a stream starts at the client's count and never skips a cycle
                        raise RemoteError(f"the run's stream sent cycle {c.index} where cycle {len(held)} was due",
                                          0, "internal")
                    self._trace.append(c)
                    self._n_cycles = max(self._n_cycles, len(held))
                    if self.engine.timing:
                        self.timings.append({"index": c.index, "at": time.perf_counter(), "decode":
                                             time.perf_counter() - t0, **frame.get("timing", {})})
                else:
                    last = frame  # the last line: the session's state, and why the stream ended (or its error)
        except ConnectionError as e:
            raise self._broken_off(since, str(e)) from None
        if last is None:
            raise self._broken_off(since, "it ended before its last line")
        if "state" in last:
            self._apply(last["state"])
        if "error" in last:
            raise_for(int(last.get("status", 500)), last)
        return last.get("end")

    def _broken_off(self, since: int, why: str) -> ConnectionError:
        """A /run stream that broke off after the cycles from ``since``: their tokens join ``generated`` (what
        this client holds, with its trace), and the message says whether the server still answers."""
        for c in self._trace.cycles[since:]:
            self.generated += committed_tokens(c)
        self._trace.new_tokens = len(self.generated)
        n, url = len(self._trace.cycles), self.engine.url
        held = f"{n} cycle(s) and {len(self.generated)} token(s) are held here (s.trace, s.tokens)"
        if self.engine._http.answers():
            return ConnectionError(f"the run's stream from {url} broke off ({why}); the server still answers: "
                                   f"{held}, and s.refresh() brings the session's state")
        return ConnectionError(f"the workbench server at {url} is gone: the run's stream broke off ({why}) and "
                               f"the server no longer answers. {held}; s.text is as the server last sent it. "
                               "The session was lost with the server: once it runs again, start a new one")

    def close(self, fetch: bool = False) -> None:
        """Drop the session on the server (its memory is returned): one request; idle sessions also expire by
        themselves. What this client read stays readable; the fields of view records not read yet do not
        (reading one says so). ``fetch=True`` fetches those first (a request per page of cycles), so the trace
        held here stays whole."""
        if fetch:
            held = self._trace.cycles
            for c in held:
                if isinstance(c, LazyCycle) and c.missing():
                    self._complete(c)
        self.engine._http("DELETE", f"/sessions/{self.id}")


def committed_tokens(c: Cycle) -> list[int]:
    """The tokens cycle ``c`` added to the output: its accepted path past the root, then the bonus, the
    first ``c.committed`` of them (fewer where the run ended inside the cycle)."""
    return (c.accepted_tokens[1:].tolist() + [int(c.bonus)])[:c.committed]
