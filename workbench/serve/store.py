"""The server's live sessions: one engine, many isolated sessions, one model call at a time.

Batching on (the default): the sessions are driven by one ``workbench.engine.scheduler.Scheduler``, so
the pending steps of every client run as rows of one cycle (one draft and one verify forward), each
client still seeing exactly its own session. Sessions with static shapes (or an engine with CUDA
graphs) are driven apart, as every session is with batching off: each its own rows, one cycle at a time.

Every forward (a prefill, a cycle) runs under ``model_lock``: the models and a shape capture's hooks
are shared, so two forwards must never interleave. Nothing else does: the prompt is checked and
tokenized, and replies are encoded, outside it. A session's own lock keeps one request at a time on
it (a run's cycles stay contiguous), with at most one more waiting. Idle sessions expire after
``limits.session_ttl`` seconds; dropping the last reference frees their KV caches, and the sweeper
hands freed memory back to the system once no request has run for ``QUIET_SECONDS`` (it stops the
process for a moment, so never under load, when the freed memory is reused anyway).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch

from workbench.shapes.hooks import ShapeCapture
from workbench.engine.core import Engine, Session
from workbench.serve.wire import short

log = logging.getLogger("workbench.serve")


@dataclass(frozen=True)
class Limits:
    """What one server allows; a request beyond a limit is refused with the limit's name.

    The transport limits keep careless and hostile clients cheap: a connection that has not sent
    its headers within ``header_timeout`` seconds (its body within ``body_timeout``) is closed, at
    most ``max_connections`` are open (the longest-waiting idle one makes room for a new one), a
    body over ``max_body_bytes`` is answered 413 unread, and a reply carries cycles up to about
    ``max_reply_bytes`` (the client fetches the rest in pages)."""

    max_sessions: int = 16
    max_new_tokens: int = 1024
    max_budget: int = 1024
    session_ttl: float = 600.0  # seconds a session may sit idle before it is dropped
    max_body_bytes: int = 2**20
    max_reply_bytes: int = 4 * 2**20
    max_connections: int = 256
    header_timeout: float = 5.0
    body_timeout: float = 10.0
    send_timeout: float = 30.0  # seconds a connection may leave a reply's bytes untaken before it is closed
    max_stream_cycles: int = 1024  # cycles one /run stream carries
    max_stream_bytes: int = 64 * 2**20  # bytes one /run stream carries (about: the frame that passes it is the last)
    max_stream_seconds: float = 600.0  # how long one /run stream may hold its session
    batching: bool = True  # the sessions' steps batched into shared cycles (workbench.engine.scheduler)
    max_batch_rows: int = 16  # sessions per batched cycle
    max_batch_nodes: int = 4096  # rows x padded tree nodes per batched verify

    def __post_init__(self):
        if not isinstance(self.batching, bool):
            raise ValueError(f"batching={self.batching!r} must be True or False")
        for name in ("max_sessions", "max_new_tokens", "max_budget", "max_body_bytes", "max_reply_bytes",
                     "max_connections", "max_batch_rows", "max_batch_nodes", "max_stream_cycles", "max_stream_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive integer")
        for name in ("session_ttl", "header_timeout", "body_timeout", "send_timeout", "max_stream_seconds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
                raise ValueError(f"{name}={v!r} must be a positive number of seconds")

    def to_dict(self) -> dict:
        return asdict(self)


class ServeError(Exception):
    """A refusal with an HTTP status, a stable code, and the request field or limit it is about."""

    MAX_MESSAGE = 1000  # a safety net: messages quote client input through wire.short() already

    def __init__(self, status: int, code: str, message: str, field: str | None = None, limit: str | None = None):
        message = message if len(message) <= self.MAX_MESSAGE else message[:self.MAX_MESSAGE - 3] + "..."
        super().__init__(message)
        self.status, self.code, self.message, self.field, self.limit = status, code, message, field, limit

    def to_dict(self) -> dict:
        d = {"error": self.code, "message": self.message}
        if self.field:
            d["field"] = self.field
        if self.limit:
            d["limit"] = self.limit
        return d


def over_limit(what: str, field_: str, value, limit: int) -> ServeError:
    return ServeError(422, "limit_exceeded", f"{field_}={value} is over this server's {what}={limit} "
                      f"(start the server with --{what.replace('_', '-')} N to allow more)", field_, what)


@dataclass
class Entry:
    id: str
    session: Session
    created: float
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    busy: int = 0  # requests holding or waiting for this session; a busy session never expires
    revision: int = 0  # bumped by every change of a setting: a client holding the current one gets deltas
    text_cache: tuple = (-1, "")  # (tokens, text) of the last reply: the text a client with that many tokens holds


MAX_WAITING = 1  # requests that may wait for a busy session; the next one is refused (429)
# Memory goes back to the system only after this long without a request: handing it back stops the process
# (a full garbage collection: 0.16 s on the embedded pair), which mid-load stalled every stream's cycle.
QUIET_SECONDS = 1.0


class SessionStore:
    def __init__(self, engine: Engine, limits: Limits = Limits(), clock=time.monotonic):
        self.engine, self.limits, self.clock = engine, limits, clock
        self.model_lock = threading.Lock()
        self.stopping = threading.Event()
        self._lock = threading.Lock()  # guards the dicts below
        self._entries: dict[str, Entry] = {}
        self._pending = 0  # sessions being created (their prefill is running)
        self._gone: OrderedDict[str, str] = OrderedDict()  # recently dropped id -> why (for a clear 404)
        self._freed = threading.Event()  # sessions were dropped: the sweeper returns their memory (when quiet)
        self._active_at = clock()  # when a request last started or ended (guarded by _lock)
        self._max_prompt_chars: int | None = None
        # CPU threads as loaded (wb.load(threads=N), serve --threads N), applied in the worker thread of every
        # forward: a worker thread started before a later torch.set_num_threads keeps the old count (other float
        # sums), so a served cycle would depend on when its thread was made
        self.threads = torch.get_num_threads()
        self.scheduler = None
        if limits.batching and getattr(engine, "graphs", None) is None:
            from workbench.engine.scheduler import BatchLimits, Scheduler

            self.scheduler = Scheduler(engine, BatchLimits(limits.max_batch_rows, limits.max_batch_nodes),
                                       lock=self.model_lock, before_cycle=self._check_running, threads=self.threads)

    def _own_threads(self) -> None:
        torch.set_num_threads(self.threads)  # always: get_num_threads() reads a global that need not be this thread's

    # ------------------------------------------------------------------ limits
    def check_policy(self, policy, field_: str = "policy") -> None:
        """The drafted nodes of the policy's largest tree (its static node count less the root: a DDTree's
        budget, a Spine's chain and siblings) within ``max_budget``."""
        nodes = policy.static_nodes(self.engine.models.block_size) - 1
        if nodes > self.limits.max_budget:
            where = f"{field_}.budget" if hasattr(policy, "budget") else field_
            raise over_limit("max_budget", where, getattr(policy, "budget", nodes), self.limits.max_budget)

    def check_new_tokens(self, n: int, field_: str = "max_new_tokens") -> None:
        if n > self.limits.max_new_tokens:
            raise over_limit("max_new_tokens", field_, n, self.limits.max_new_tokens)

    def max_prompt_chars(self) -> int:
        """Characters beyond which a prompt cannot fit the target's positions, whatever it says: no token
        spells more characters than the vocabulary's longest one (found once)."""
        if self._max_prompt_chars is None:
            longest = max(map(len, self.engine.tokenizer.get_vocab()), default=1)
            self._max_prompt_chars = self.engine.models.max_positions * max(longest, 1)
        return self._max_prompt_chars

    def check_prompt(self, prompt: str) -> None:
        """Refuse a prompt that cannot run, cheaply and outside the model lock: a length check first,
        so a pasted megabyte is never tokenized, then the token count (the engine's own message)."""
        cap = self.max_prompt_chars()
        if len(prompt) > cap:
            raise ServeError(422, "limit_exceeded", f"prompt is {len(prompt)} characters; the target has "
                             f"{self.engine.models.max_positions} positions, so a prompt over {cap} characters "
                             "cannot fit; shorten the prompt", "prompt", "max_positions")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON's "\\ud800" decodes to a str that is not text
            raise ServeError(422, "invalid", f"prompt has a lone surrogate {prompt[e.start]!r} at character "
                             f"{e.start}: not text; send valid UTF-8", "prompt") from None
        n = len(self.engine.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if n >= self.engine.models.max_positions:
            raise ServeError(422, "limit_exceeded", f"prompt is {n} tokens but the target has "
                             f"{self.engine.models.max_positions} positions; shorten the prompt", "prompt",
                             "max_positions")

    # ------------------------------------------------------------------ sessions
    def create(self, prompt: str | None, policy, capture: bool = False, *, messages=None, prompt_ids=None,
               arrival: dict | None = None, **kw) -> Entry:
        """A session from one of ``prompt`` (text), ``messages`` (chat) or ``prompt_ids``, as engine.session;
        the prompt is checked and encoded here, outside the model lock. A batched one is said to be arriving
        (``Scheduler.arriving``; ``arrival``: said already, by the app when the request's head came) until it
        is submitted or refused, so that sessions opened together share one prefill."""
        batched = self.scheduler is not None and not kw.get("static_shapes")
        if arrival is not None and not batched:
            self.scheduler.settle(arrival)  # driven apart: no prefill waits for it
            arrival = None
        if arrival is None and batched:
            with self.scheduler.arriving() as arrival:
                return self.open(prompt, policy, capture, messages, prompt_ids, arrival, kw)
        try:
            return self.open(prompt, policy, capture, messages, prompt_ids, arrival, kw)
        finally:
            if arrival is not None:
                self.scheduler.settle(arrival)  # refused on its way: no prefill waits for it any longer

    def open(self, prompt, policy, capture: bool, messages, prompt_ids, arrival: dict | None, kw: dict) -> Entry:
        """``create``'s work: checked, encoded, counted against max_sessions, then prefilled (batched when
        ``arrival`` is given, else driven apart)."""
        self.check_policy(policy)
        self.check_new_tokens(kw.get("max_new_tokens", 1))
        self._check_running()
        if prompt is not None:
            self.check_prompt(prompt)
        prompt = self.engine.encode(prompt, messages=messages, prompt_ids=prompt_ids)  # one of them, or ValueError
        self.expire()
        with self._lock:
            live = len(self._entries) + self._pending
            if live >= self.limits.max_sessions:
                raise ServeError(429, "limit_exceeded",
                                 f"{live} live sessions: this server's max_sessions={self.limits.max_sessions} is "
                                 "reached; delete a session, wait for idle ones to expire, or start the server "
                                 "with --max-sessions N", limit="max_sessions")
            self._pending += 1
        try:
            cap = ShapeCapture(self.engine) if capture else None
            if arrival is not None:
                s = self.scheduler.session(prompt, policy=policy, capture=cap, arrival=arrival, **kw)
            else:  # driven apart: its own rows, its cycles under the model lock one at a time
                with self.model_lock:
                    self._check_running()
                    self._own_threads()
                    s = self.engine.session(prompt, policy=policy, capture=cap, **kw)
                s.step = self._locked(s)
            now = self.clock()
            e = Entry(secrets.token_hex(8), s, now, now)
            with self._lock:
                self._entries[e.id] = e
                self._active_at = now
        finally:
            with self._lock:
                self._pending -= 1
        log.info("session %s created: %s, %d prompt tokens", e.id, s.policy, len(s.prompt_ids))
        return e

    def _locked(self, session: Session):
        # Session.run() loops over self.step(); taking the model lock per cycle (not per run)
        # lets a long run interleave with other sessions' cycles. The wrapper holds the session
        # weakly, so dropping the store's entry frees the session (and its caches) at once.
        ref, step = weakref.ref(session), type(session).step

        def step_locked():
            with self.model_lock:
                self._check_running()
                self._own_threads()
                return step(ref())

        return step_locked

    def _check_running(self) -> None:
        if self.stopping.is_set():
            raise ServeError(503, "stopping", "the server is shutting down; no more cycles are run")

    @contextmanager
    def use(self, sid: str):
        """The entry ``sid``, held for one request (404 if there is none, 429 if one request runs on it
        and another already waits: a client cannot pile up threads behind one session)."""
        with self._lock:
            e = self._entries.get(sid)
            if e is None:
                why = self._gone.get(sid)
                raise ServeError(404, "unknown_session", f"session {short(sid)} {why or 'does not exist'}",
                                 "session_id")
            if e.busy > MAX_WAITING:
                raise ServeError(429, "session_busy", f"session {sid} is busy: one request runs on it and "
                                 f"{e.busy - 1} more wait{'s' if e.busy == 2 else ''}; retry when it is done")
            e.busy += 1
            self._active_at = self.clock()
        try:
            with e.lock:
                yield e
        finally:
            with self._lock:
                e.busy -= 1
                e.last_used = self._active_at = self.clock()

    def set_capture(self, e: Entry, on: bool) -> None:
        s = e.session
        if on and s.capture is None:
            s.capture = ShapeCapture(s)
        elif not on:
            s.capture = None

    def delete(self, sid: str) -> None:
        with self.use(sid):
            self._drop(sid, "was deleted")
        log.info("session %s deleted", sid)

    def _drop(self, sid: str, why: str) -> None:
        with self._lock:
            e = self._entries.pop(sid, None)
        if e is not None and self.scheduler is not None and e.session.driver is self.scheduler:
            self.scheduler.release(e.session)  # its rows leave the batch
        with self._lock:
            self._gone[sid] = why
            while len(self._gone) > 4096:
                self._gone.popitem(last=False)
        self._freed.set()

    def quiet(self) -> bool:
        """No session is being created or used, and none has been for ``QUIET_SECONDS``."""
        with self._lock:
            busy = self._pending or any(e.busy for e in self._entries.values())
            return not busy and self.clock() - self._active_at >= QUIET_SECONDS

    def release_memory(self) -> None:
        """Hand memory freed by dropped sessions back to the system: the allocator keeps freed pages
        (glibc's arenas, torch's CUDA cache) for reuse otherwise, and the process's size never falls."""
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        if _LIBC is not None:
            _LIBC.malloc_trim(0)

    def expire(self) -> list[str]:
        """Drop sessions idle for longer than the TTL; returns their ids."""
        now, ttl = self.clock(), self.limits.session_ttl
        with self._lock:
            old = [e for e in self._entries.values() if not e.busy and now - e.last_used > ttl]
        for e in old:
            self._drop(e.id, f"expired after {ttl:g} s idle")
            log.info("session %s expired after %.0f s idle", e.id, now - e.last_used)
        return [e.id for e in old]

    def drop_all(self) -> list[str]:
        with self._lock:
            ids = list(self._entries)
        for sid in ids:
            self._drop(sid, "was dropped when the server stopped")
        return ids

    def batching_stats(self) -> dict | None:
        """The scheduler's counts (cycles, rows stepped, most rows in one cycle, most cycles a step waited,
        ...), or None with batching off."""
        return None if self.scheduler is None else asdict(self.scheduler.stats)

    def close(self) -> None:
        """Stop the batching worker (after ``drop_all``): later steps are refused."""
        if self.scheduler is not None:
            self.scheduler.close()

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def memory(self) -> dict:
        """What the process holds: resident bytes (the OS's count), and on CUDA the allocator's bytes."""
        out = {"rss_bytes": rss_bytes()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda_allocated_bytes"] = torch.cuda.memory_allocated()
            out["cuda_reserved_bytes"] = torch.cuda.memory_reserved()
        return out

    def kv_bytes(self) -> int:
        """Bytes held by the live sessions' KV caches (target and drafter)."""
        total = 0
        for e in self.entries():
            total += e.session.cache_bytes()
        return total

    # ------------------------------------------------------------------ expiry in the background
    def sweep_once(self) -> bool:
        """One pass of the sweeper: drop expired sessions; once sessions have been dropped and the store is
        ``quiet()``, hand their memory back. -> whether it did."""
        self.expire()
        if not (self._freed.is_set() and self.quiet()):
            return False
        self._freed.clear()
        self.release_memory()
        return True

    def start_sweeper(self) -> threading.Thread:
        period = min(max(self.limits.session_ttl / 4, 0.05), 5.0)

        def sweep():
            while not self.stopping.wait(period):
                try:
                    self.sweep_once()
                except Exception:  # noqa: BLE001 - the sweeper must outlive one bad pass
                    log.exception("session sweep failed")

        t = threading.Thread(target=sweep, name="workbench-serve-sweeper", daemon=True)
        t.start()
        return t


def _libc():
    try:  # glibc only: malloc_trim returns freed heap pages to the system
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return lib if hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()


def rss_bytes() -> int | None:
    """This process's resident set size in bytes (Linux /proc; psutil elsewhere; None if neither)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # noqa: BLE001 - no way to tell on this platform
        return None
