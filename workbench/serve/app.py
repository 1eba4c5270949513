"""The HTTP API (FastAPI) over a SessionStore; the messages are described in docs/wire-format.md.

Routes are plain ``def`` functions: FastAPI runs them in worker threads, and the store's
locks decide what may run at once. Every error leaves as ``{"error", "message", "field"?,
"limit"?}`` with a 4xx status; an unexpected one is logged and answered 500, never fatal.
"""
from __future__ import annotations

import hmac
import logging
import platform
import re
import tempfile
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from ddtree_kernels import check_backend
from workbench import wire
from workbench.engine import DEFAULT_MAX_NEW_TOKENS, SessionFinished
from workbench.serve.store import Entry, ServeError, SessionStore

log = logging.getLogger("workbench.serve")


class JSON(Response):
    media_type = "application/json"

    def render(self, content) -> bytes:
        return wire.dumps(content)


def error(e: ServeError) -> JSON:
    return JSON(e.to_dict(), status_code=e.status)


# ------------------------------------------------------------------------------------------ requests
class _Body(BaseModel):
    # strict: 1.0 is not an int, "3" is not a number, true is not an int (as in the local API)
    model_config = ConfigDict(extra="forbid", strict=True)


class SessionRequest(_Body):
    prompt: str
    policy: str | dict = "ddtree:32"
    temperature: float = Field(0.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int = 0
    max_new_tokens: int | None = Field(None, ge=1)  # None: the engine's default, capped by the server's limit
    kernel_backend: str | None = None
    record_topk: int = Field(8, ge=0, le=4096)
    capture: bool = False


class SettingsRequest(_Body):
    policy: str | dict | None = None
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    capture: bool | None = None


class StepRequest(_Body):
    since: int = Field(0, ge=0)  # the client's cycle count: cycles from here on come back


class RunRequest(StepRequest):
    max_new_tokens: int | None = Field(None, ge=1)


# ------------------------------------------------------------------------------------------ replies
def session_state(e: Entry, since: int = 0) -> dict:
    s = e.session
    kv = [[list(k.shape), list(v.shape)] for k, v in s.kv_cache()]
    return {
        "id": e.id, "prompt": s.prompt, "prompt_ids": s.prompt_ids, "policy": wire.policy_to_wire(s.policy),
        "temperature": s.sampling.temperature, "top_p": s.sampling.top_p, "top_k": s.sampling.top_k,
        "seed": s.seed, "max_new_tokens": s.max_new_tokens, "kernel_backend": s.kernel_backend,
        "record_topk": s.record_topk, "capture": s.capture is not None, "generated": list(s.generated),
        "text": s.text, "finish_reason": s.finish_reason, "n_cycles": len(s.cycles), "kv_shapes": kv,
        "trace": wire.trace_head_to_wire(s.trace), "since": since,
        "cycles": wire.cycles_to_wire(s.cycles[since:]),
    }


def _policy(raw, store: SessionStore, field_: str = "policy"):
    try:
        p = wire.policy_from_wire(raw)
    except (ValueError, TypeError) as ex:
        raise ServeError(422, "invalid", f"{field_}: {ex}", field_) from None
    store.check_policy(p, field_)
    return p


_FIELD = re.compile(r"\b(prompt|max_new_tokens|temperature|top_p|top_k|kernel_backend|budget|width)\b")


def _field_of(msg: str) -> str | None:
    """The request field an engine ValueError names (its messages say 'name=value ...')."""
    m = _FIELD.search(msg)
    return m.group(1) if m else None


# ------------------------------------------------------------------------------------------ the app
def create_app(store: SessionStore, token: str) -> FastAPI:
    app = FastAPI(title="ddtree-workbench engine", version=str(wire.WIRE_VERSION), docs_url=None, redoc_url=None,
                  openapi_url=None)
    want = token.encode()
    app.state.store = store

    @app.middleware("http")
    async def guard(request: Request, call_next):
        got = request.headers.get("authorization", "")
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), want):
            msg = ("missing token: send 'Authorization: Bearer TOKEN' (the token the server printed at start)"
                   if not got else "wrong token: use the token the server printed at start (or its --token-file)")
            return error(ServeError(401, "unauthorized", msg))
        theirs = request.headers.get(wire.VERSION_HEADER)
        if theirs is not None and theirs != str(wire.WIRE_VERSION):
            return error(ServeError(400, "wire_version", wire.version_mismatch(theirs, wire.WIRE_VERSION)))
        try:
            return await call_next(request)
        except Exception:  # noqa: BLE001 - a bug in one request must not stop the server
            log.exception("unexpected error in %s %s", request.method, request.url.path)
            return error(ServeError(500, "internal", "unexpected server error (logged on the server)"))

    @app.exception_handler(ServeError)
    async def on_serve_error(_req, e: ServeError):
        return error(e)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_req, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path")]
        name = "body" if first.get("type") == "json_invalid" else (".".join(loc) or "body")
        msg = f"{name}: {first.get('msg', 'invalid')}"
        if "input" in first and first.get("type") != "missing" and name != "body":
            msg += f" (got {first['input']!r})"[:200]
        return error(ServeError(422, "invalid", msg, name))

    @app.exception_handler(SessionFinished)
    async def on_finished(_req, e: SessionFinished):
        return error(ServeError(409, "session_finished", str(e)))

    @app.exception_handler(ValueError)
    async def on_value(_req, e: ValueError):
        msg = " ".join(str(e).split())
        return error(ServeError(422, "invalid", msg, _field_of(msg)))

    # -------------------------------------------------------------- engine
    @app.get("/health")
    def health():
        return JSON({"status": "ok", "sessions": len(store), "session_kv_bytes": store.kv_bytes(),
                     "wire_version": wire.WIRE_VERSION})

    @app.get("/info")
    def info():
        import fastapi
        import torch
        import transformers
        import uvicorn

        import workbench

        eng, m = store.engine, store.engine.models
        t = m.target.config
        return JSON({
            "wire_version": wire.WIRE_VERSION, "engine": repr(eng),
            "models": {"target": str(m.target_dir), "draft": str(m.draft_dir), "target_layers": t.num_hidden_layers,
                       "vocab_size": t.vocab_size, "block_size": m.block_size,
                       "target_layer_ids": m.target_layer_ids, "max_positions": m.max_positions},
            "device": str(eng.device), "dtype": str(m.dtype).replace("torch.", ""),
            "kernel_backend": eng.kernel_backend, "limits": store.limits.to_dict(), "sessions": len(store),
            "versions": {"workbench": workbench.__version__, "wire": wire.WIRE_VERSION, "python": platform.python_version(),
                         "torch": torch.__version__, "transformers": transformers.__version__,
                         "fastapi": fastapi.__version__, "uvicorn": uvicorn.__version__},
        })

    tok_files: dict = {}

    @app.get("/tokenizer")
    def tokenizer():
        if not tok_files:  # the tokenizer as its files, so a client builds the very same one
            with tempfile.TemporaryDirectory() as d:
                store.engine.tokenizer.save_pretrained(d)
                tok_files.update({p.name: p.read_text() for p in Path(d).iterdir() if p.is_file()})
        return JSON({"files": tok_files})

    # -------------------------------------------------------------- sessions
    @app.get("/sessions")
    def list_sessions():
        now = store.clock()
        return JSON({"sessions": [
            {"id": e.id, "prompt": e.session.prompt[:80], "policy": str(e.session.policy),
             "n_cycles": len(e.session.cycles), "new_tokens": len(e.session.generated),
             "finished": e.session.finished, "idle_seconds": round(now - e.last_used, 3)}
            for e in store.entries()]})

    @app.post("/sessions", status_code=201)
    def create(req: SessionRequest):
        policy = _policy(req.policy, store)
        if req.kernel_backend is not None:
            try:
                check_backend(req.kernel_backend)
            except (ValueError, RuntimeError) as ex:
                raise ServeError(422, "invalid", str(ex), "kernel_backend") from None
        kw = req.model_dump(exclude={"prompt", "policy", "capture"})
        if kw["max_new_tokens"] is None:
            kw["max_new_tokens"] = min(DEFAULT_MAX_NEW_TOKENS, store.limits.max_new_tokens)
        e = store.create(req.prompt, policy, capture=req.capture, **kw)
        with store.use(e.id):
            return JSON(session_state(e), status_code=201)

    @app.get("/sessions/{sid}")
    def get(sid: str, since: int = 0):
        if since < 0:
            raise ServeError(422, "invalid", f"since={since} must be >= 0", "since")
        with store.use(sid) as e:
            return JSON(session_state(e, since))

    @app.patch("/sessions/{sid}")
    def settings(sid: str, req: SettingsRequest):
        with store.use(sid) as e:
            s = e.session
            if req.policy is not None:
                s.policy = _policy(req.policy, store)
            if req.temperature is not None:
                s.temperature = req.temperature
            if req.capture is not None:
                store.set_capture(e, req.capture)
            return JSON(session_state(e, len(s.cycles)))

    @app.post("/sessions/{sid}/step")
    def step(sid: str, req: StepRequest):
        with store.use(sid) as e:
            e.session.step()
            return JSON(session_state(e, req.since))

    @app.post("/sessions/{sid}/run")
    def run(sid: str, req: RunRequest):
        if req.max_new_tokens is not None:
            store.check_new_tokens(req.max_new_tokens)
        with store.use(sid) as e:
            e.session.run(req.max_new_tokens)
            return JSON(session_state(e, req.since))

    @app.delete("/sessions/{sid}")
    def delete(sid: str):
        store.delete(sid)
        return JSON({"deleted": sid})

    return app

