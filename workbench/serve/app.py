"""The HTTP API (FastAPI) over a SessionStore; the messages are described in docs/wire-format.md.

Model routes are plain ``def`` functions: FastAPI runs them in worker threads, and the store's
locks decide what may run at once; ``/health`` and ``/sessions`` are ``async`` and answer from
the event loop, so queued model calls never delay them. ``Guard`` (plain ASGI, outermost)
checks the token, the wire version and the body size before anything reads the body. Every
error leaves as ``{"error", "message", "field"?, "limit"?}`` with a 4xx status; an unexpected
one is logged and answered 500, never fatal. The routes (``ROUTES``) and error handlers are
module-level functions that read the store from ``request.app.state.store``; ``create_app`` wires
them to one store and token.
"""
from __future__ import annotations

import hmac
import logging
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from ddtree_kernels import check_backend
from workbench.serve import wire
from workbench.engine.core import DEFAULT_MAX_NEW_TOKENS, SessionFinished
from workbench.serve.replies import session_state, step_timing
from workbench.serve.store import Entry, ServeError, SessionStore
from workbench.serve.stream import RunStream

log = logging.getLogger("workbench.serve")
INT32 = 2**31 - 1  # bounds for counts, so a 30-digit integer is a 422, not an overflow deep in torch
ARRIVED = "workbench.arrived"  # the scope key of when the request reached the app (its head parsed)
ARRIVAL = "workbench.arrival"  # the scope key of a new session's arrival (Scheduler.arriving), from its head on


class JSON(Response):
    media_type = "application/json"

    def render(self, content) -> bytes:
        return content if isinstance(content, bytes) else wire.dumps(content)


def error(e: ServeError, close: bool = False) -> JSON:
    return JSON(e.to_dict(), status_code=e.status, headers={"connection": "close"} if close else None)


# ------------------------------------------------------------------------------------------ the guard
class Guard:
    """Token, wire version and body size, checked from the headers alone (a new session is then said to be
    arriving); then the app, with the body counted as it arrives (a chunked body has no Content-Length) and any
    escaped bug answered 500."""

    def __init__(self, app, store: SessionStore, token: str):
        self.app, self.store, self.want = app, store, token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope[ARRIVED] = time.perf_counter()  # (a step's timing tells the framework's share from the route's)
        headers = dict(scope["headers"])  # lower-case byte names (uvicorn)
        refusal = self.check_headers(headers)
        if refusal is not None:
            # An unauthenticated client's connection is closed; one over the body limit is answered at once and
            # its body, if it sends one anyway, is discarded as it arrives (within body_timeout), so the client
            # reads the 413 instead of a reset connection.
            return await error(refusal, close=refusal.status != 413)(scope, receive, send)
        scheduler = self.store.scheduler
        if scheduler is not None and scope.get("method") == "POST" and scope.get("path") == "/sessions":
            # A session is on its way from its request's head on (its body, its prompt's tokens still to come):
            # a prefill about to run waits for it, so sessions opened together share one (Scheduler.arriving).
            with scheduler.arriving() as arrival:
                scope[ARRIVAL] = arrival
                return await self.counted(scope, receive, send)
        return await self.counted(scope, receive, send)

    async def counted(self, scope, receive, send):
        """The app, with the body counted as it arrives and any escaped bug answered 500."""
        limit, seen, started, refused = self.store.limits.max_body_bytes, 0, False, False

        async def counted_receive():
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:  # answer now; the app sees a client that went away
                    refused = True
                    await error(self.too_large(f"over {limit}"))(scope, receive, send_raw)
                    return {"type": "http.disconnect"}
            return msg

        async def send_raw(msg):
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        async def app_send(msg):
            if not refused:
                await send_raw(msg)

        try:
            await self.app(scope, counted_receive, app_send)
        except Exception:  # noqa: BLE001 - a bug in one request must not stop the server
            log.exception("unexpected error in %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await error(ServeError(500, "internal", "unexpected server error (logged on the server)"))(
                    scope, receive, send_raw)

    def check_headers(self, headers: dict) -> ServeError | None:
        got = headers.get(b"authorization", b"")
        scheme, _, value = got.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(value.strip(), self.want):
            return ServeError(401, "unauthorized", "missing token: send 'Authorization: Bearer TOKEN' (the token in "
                              "the server's --token-file, or the one `serve` printed when it generated it)" if not got
                              else "wrong token: use the one in the server's --token-file (or the one `serve` "
                              "printed when it generated it)")
        theirs = headers.get(wire.VERSION_HEADER.lower().encode())
        if theirs is not None and theirs != str(wire.WIRE_VERSION).encode():
            return ServeError(400, "wire_version", wire.version_mismatch(theirs.decode("latin-1"), wire.WIRE_VERSION))
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit() or len(length) > 18:
                return ServeError(400, "invalid", f"Content-Length {wire.short(length.decode('latin-1'))} is not "
                                  "a byte count", "body")
            if int(length) > self.store.limits.max_body_bytes:
                return self.too_large(f"{int(length)} bytes, over")
        return None

    def too_large(self, what: str) -> ServeError:
        limit = self.store.limits.max_body_bytes
        return ServeError(413, "limit_exceeded", f"request body is {what} this server's max_body_bytes={limit} "
                          "(a prompt that long cannot fit the model anyway; start the server with "
                          "--max-body-bytes N to allow more)", "body", "max_body_bytes")


# ------------------------------------------------------------------------------------------ requests
class _Body(BaseModel):
    # strict: 1.0 is not an int, "3" is not a number, true is not an int (as in the local API)
    model_config = ConfigDict(extra="forbid", strict=True)


class SessionRequest(_Body):
    prompt: str | None = None  # exactly one of prompt, messages, prompt_ids (as engine.session)
    messages: list[dict] | None = Field(None, max_length=4096)
    prompt_ids: list[int] | None = Field(None, max_length=2**20)
    static_shapes: bool | None = None
    policy: str | dict = "ddtree:32"
    temperature: float = Field(0.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(0, ge=0, le=INT32)
    seed: int = Field(0, ge=0, lt=2**64)
    max_new_tokens: int | None = Field(None, ge=1, le=INT32)  # None: the engine's default, capped by the limit
    kernel_backend: str | None = Field(None, max_length=64)
    record_topk: int = Field(8, ge=0, le=4096)
    capture: bool = False


class SettingsRequest(_Body):
    """Settings for the next cycle, applied in this order (as the same setters on a local session)."""
    policy: str | dict | None = None
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0, le=INT32)
    seed: int | None = Field(None, ge=0, lt=2**64)
    max_new_tokens: int | None = Field(None, ge=1, le=INT32)
    capture: bool | None = None


class StepRequest(_Body):
    since: int = Field(0, ge=0, le=INT32)  # the client's cycle count: cycles from here on come back
    have_tokens: int | None = Field(None, ge=0, le=INT32)  # the generated tokens it holds: only the rest comes
    revision: int | None = Field(None, ge=0, le=INT32)  # the settings revision it holds: if current, no full state
    records: Literal["view", "full"] = "view"  # what the cycles carry: what a view reads, or every field
    timing: bool = False  # send back where the step's time went on the server


class RunRequest(StepRequest):
    max_new_tokens: int | None = Field(None, ge=1, le=INT32)


# ------------------------------------------------------------------------------------------ replies
def _policy(raw, store: SessionStore, field_: str = "policy"):
    try:
        p = wire.policy_from_wire(raw)
    except (ValueError, TypeError) as ex:
        raise ServeError(422, "invalid", f"{field_}: {ex}", field_) from None
    store.check_policy(p, field_)
    return p


_FIELD = re.compile(r"\b(prompt_ids|messages|prompt|max_new_tokens|temperature|top_p|top_k|kernel_backend|budget|"
                    r"width|seed|static_shapes)\b")


def _field_of(msg: str) -> str | None:
    """The request field an engine ValueError names (its messages say 'name=value ...')."""
    m = _FIELD.search(msg)
    return m.group(1) if m else None


def _parse_error(e: HTTPException) -> str:
    """Why FastAPI could not parse a body, in one bounded line (a 5000-digit integer, bytes that are not UTF-8)."""
    why = str(e.__cause__ or "").split(":")[0] or "not JSON"
    return f"body: cannot be parsed ({wire.short(why, 120)[1:-1]}); send one JSON object in UTF-8"


# ------------------------------------------------------------------------------------------ the app
def create_app(store: SessionStore, token: str) -> FastAPI:
    """The API over ``store``: the guard outermost, then the error handlers and the routes (``ROUTES``), which
    read the store from ``request.app.state.store``."""
    app = FastAPI(title="ddtree-workbench engine", version=str(wire.WIRE_VERSION), docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.store = store
    app.state.tokenizer_files = {}  # the tokenizer's files, read once (GET /tokenizer)
    app.add_middleware(Guard, store=store, token=token)  # outermost of ours: nothing reads a body before it
    for kind, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(kind, handler)
    app.include_router(ROUTES)
    return app


# ------------------------------------------------------------------------------------------ errors
async def on_serve_error(_req, e: ServeError):
    return error(e)


async def on_http(req: Request, e: HTTPException):
    # Starlette's own refusals (no such route, wrong method, an unparsable body) in our shape.
    if e.status_code == 400:
        return error(ServeError(422, "invalid", _parse_error(e), "body"))
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "invalid")
    msg = (f"no route {req.method} {wire.short(req.url.path)[1:-1]}; see docs/wire-format.md for the endpoints"
           if e.status_code in (404, 405) else wire.short(str(e.detail), 200))
    return error(ServeError(e.status_code, code, msg))


async def on_invalid(_req, e: RequestValidationError):
    errs = e.errors()
    first = errs[0] if errs else {}
    loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path")]
    name = "body" if first.get("type") == "json_invalid" else (".".join(loc) or "body")
    msg = f"{name}: {first.get('msg', 'invalid')}"
    if "input" in first and first.get("type") != "missing" and name != "body":
        msg += f" (got {wire.short(first['input'])})"
    return error(ServeError(422, "invalid", msg, name[:64]))


async def on_finished(_req, e: SessionFinished):
    return error(ServeError(409, "session_finished", str(e)))


async def on_value(_req, e: ValueError):
    msg = " ".join(str(e).split())
    return error(ServeError(422, "invalid", msg, _field_of(msg)))


ERROR_HANDLERS = {ServeError: on_serve_error, HTTPException: on_http, RequestValidationError: on_invalid,
                  SessionFinished: on_finished, ValueError: on_value}


# ------------------------------------------------------------------------------------------ routes
ROUTES = APIRouter()


def _store(request: Request) -> SessionStore:
    return request.app.state.store


def state(store: SessionStore, e: Entry, since: int = 0, until: int | None = None, status: int = 200,
          records: str = "full", req: StepRequest | None = None, timing: dict | None = None) -> JSON:
    """A reply carrying the session's state (``replies.session_state``), within the store's reply limit."""
    held = {} if req is None else {"have_tokens": req.have_tokens, "revision": req.revision}
    return JSON(session_state(e, since, until, store.limits.max_reply_bytes, records, timing=timing, **held),
                status_code=status)


# -------------------------------------------------------------- engine
@ROUTES.get("/health")
async def health(request: Request):
    store = _store(request)
    return JSON({"status": "ok", "sessions": len(store), "session_kv_bytes": store.kv_bytes(),
                 **store.memory(), "wire_version": wire.WIRE_VERSION, "batching": store.batching_stats()})


@ROUTES.get("/info")
def info(request: Request):
    import fastapi
    import torch
    import transformers
    import uvicorn

    from workbench.version import __version__

    store = _store(request)
    eng, m = store.engine, store.engine.models
    t = m.target.config
    return JSON({
        "wire_version": wire.WIRE_VERSION, "engine": repr(eng),
        "models": {"target": str(m.target_dir), "draft": str(m.draft_dir), "target_layers": t.num_hidden_layers,
                   "vocab_size": t.vocab_size, "block_size": m.block_size,
                   "target_layer_ids": m.target_layer_ids, "max_positions": m.max_positions},
        "device": str(eng.device), "dtype": str(m.dtype).replace("torch.", ""),
        "kernel_backend": eng.kernel_backend, "limits": store.limits.to_dict(), "sessions": len(store),
        "versions": {"workbench": __version__, "wire": wire.WIRE_VERSION, "python": platform.python_version(),
                     "torch": torch.__version__, "transformers": transformers.__version__,
                     "fastapi": fastapi.__version__, "uvicorn": uvicorn.__version__},
    })


@ROUTES.get("/tokenizer")
def tokenizer(request: Request):
    tok_files = request.app.state.tokenizer_files
    if not tok_files:  # the tokenizer as its files, so a client builds the very same one
        with tempfile.TemporaryDirectory() as d:
            _store(request).engine.tokenizer.save_pretrained(d)
            tok_files.update({p.name: p.read_text() for p in Path(d).iterdir() if p.is_file()})
    return JSON({"files": tok_files})


# -------------------------------------------------------------- sessions
@ROUTES.get("/sessions")
async def list_sessions(request: Request):
    store = _store(request)
    now = store.clock()
    return JSON({"sessions": [
        {"id": e.id, "prompt": e.session.prompt[:80], "policy": str(e.session.policy),
         "n_cycles": len(e.session.cycles), "new_tokens": len(e.session.generated),
         "finished": e.session.finished, "busy": e.busy > 0, "idle_seconds": round(now - e.last_used, 3)}
        for e in store.entries()]})


@ROUTES.post("/sessions", status_code=201)
def create(req: SessionRequest, request: Request):
    store = _store(request)
    policy = _policy(req.policy, store)
    if req.kernel_backend is not None:
        try:
            check_backend(req.kernel_backend)
        except (ValueError, RuntimeError) as ex:
            raise ServeError(422, "invalid", str(ex), "kernel_backend") from None
    kw = req.model_dump(exclude={"prompt", "policy", "capture", "messages", "prompt_ids"})
    if kw["max_new_tokens"] is None:
        kw["max_new_tokens"] = min(DEFAULT_MAX_NEW_TOKENS, store.limits.max_new_tokens)
    e = store.create(req.prompt, policy, capture=req.capture, messages=req.messages, prompt_ids=req.prompt_ids,
                     arrival=request.scope.get(ARRIVAL),
                     **kw)
    with store.use(e.id):
        return state(store, e, status=201)


@ROUTES.get("/sessions/{sid}")
def get(sid: str, request: Request, since: int = 0, until: int | None = None, records: str = "view"):
    for name, v in (("since", since), ("until", until)):
        if v is not None and not 0 <= v <= INT32:
            raise ServeError(422, "invalid", f"{name}={wire.short(v)} must be from 0 to {INT32}", name)
    if records not in wire.RECORDS:
        raise ServeError(422, "invalid", f"records={wire.short(records)} must be 'view' or 'full'", "records")
    store = _store(request)
    with store.use(sid) as e:
        return state(store, e, since, until, records=records)


@ROUTES.patch("/sessions/{sid}")
def settings(sid: str, req: SettingsRequest, request: Request):
    store = _store(request)
    with store.use(sid) as e:
        s = e.session
        try:
            if req.policy is not None:
                s.policy = _policy(req.policy, store)
            if req.max_new_tokens is not None:
                store.check_new_tokens(req.max_new_tokens)
            for name in ("temperature", "top_p", "top_k", "seed", "max_new_tokens"):
                v = getattr(req, name)
                if v is not None:
                    setattr(s, name, v)  # the session's own checks and messages, and its trace's record
            if req.capture is not None:
                store.set_capture(e, req.capture)
        finally:  # (a refusal may come after a change that took: every client gets the full state again)
            e.revision += 1
        return state(store, e, len(s.cycles))


@ROUTES.post("/sessions/{sid}/step")
def step(sid: str, req: StepRequest, request: Request):
    t0 = time.perf_counter()
    store = _store(request)
    with store.use(sid) as e:
        t1 = time.perf_counter()
        c = e.session.step()
        timing = None
        if req.timing:  # the framework's share: from the head parsed to this handler (body, checks, thread)
            timing = {**step_timing(time.perf_counter() - t1, c, t0),
                      "http": t0 - request.scope.get(ARRIVED, t0)}
        return state(store, e, req.since, records=req.records, req=req, timing=timing)


@ROUTES.post("/sessions/{sid}/run")
def run(sid: str, req: RunRequest, request: Request):
    """One streamed reply (workbench.serve.stream): the route holds the session and applies the request,
    so that a refusal is a plain error reply; the stream hands the session back when it ends."""
    store = _store(request)
    if req.max_new_tokens is not None:
        store.check_new_tokens(req.max_new_tokens)
    held = store.use(sid)
    e = held.__enter__()
    try:
        if req.max_new_tokens is not None:
            try:
                e.session.max_new_tokens = req.max_new_tokens  # as Session.run(max_new_tokens) does
            finally:
                e.revision += 1
        return RunStream(e, lambda: held.__exit__(None, None, None), req.since, req.records, req.timing,
                         store.limits, store.stopping, req.have_tokens, req.revision)
    except BaseException as ex:
        held.__exit__(type(ex), ex, ex.__traceback__)
        raise


@ROUTES.delete("/sessions/{sid}")
def delete(sid: str, request: Request):
    _store(request).delete(sid)
    return JSON({"deleted": sid})
