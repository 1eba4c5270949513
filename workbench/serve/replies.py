"""The session state a reply carries (docs/wire-format.md, "Session state"): whole, or what changed.

Every reply to a session request carries the cycles from the client's ``since`` on (a page of about
``budget`` bytes, at least one cycle), the tokens and text the client lacks, and where the session
stands. A *full* state adds everything else the client mirrors (prompt, settings, KV shapes, the
trace's header); a reply leaves that out when the client says it holds the session's current
``revision`` (the store bumps it whenever a setting changes), so a step's reply costs what the
step changed, not what the session holds. Cycles are encoded once, as bytes, and spliced in.
"""
from __future__ import annotations

import time

from workbench.serve import wire


def text_since(e, have_tokens: int | None) -> tuple[int, str]:
    """(from, tail): the session's text is the client's first ``from`` characters plus ``tail``.

    Decoding is a function of the tokens, so a client holding ``have_tokens`` tokens holds the text the
    store last sent with that many; when the new text still starts with it (the usual case: a token's
    bytes may complete a character only at the end), only the rest travels."""
    s = e.session
    n = len(s.generated)
    held_n, held = e.text_cache
    new = held if held_n == n else s.text
    e.text_cache = (n, new)
    if have_tokens is not None and held_n == have_tokens and new.startswith(held):
        return len(held), new[len(held):]
    return 0, new


def session_state(e, since: int = 0, until: int | None = None, budget: int = 4 * 2**20, records: str = "full",
                  have_tokens: int | None = None, revision: int | None = None, timing: dict | None = None) -> bytes:
    """The session's state with its cycles ``since`` .. ``until`` (default: the end), as many as fit in
    about ``budget`` bytes (always one, if any); ``until`` in the reply says where the page ends.

    ``have_tokens``: the generated tokens the client holds (None: it holds none); ``revision``: the
    settings revision it holds (None, or an old one: the full state comes). ``timing``: where the
    request's time went so far, sent back with the encoding's time added (None: nothing is measured)."""
    t0 = time.perf_counter()
    s = e.session
    n = len(s.cycles)
    since = min(since, n)
    until = n if until is None else max(since, min(until, n))
    page, size = [], 0
    for c in s.cycles[since:until]:
        b = wire.dumps(wire.cycle_to_wire(c, records))
        if page and size + len(b) > budget:
            break
        page.append(b)
        size += len(b) + 1
    full = revision != e.revision
    gen_from = 0 if full or have_tokens is None else min(have_tokens, len(s.generated))
    text_from, text = text_since(e, None if full else have_tokens)
    head = {"id": e.id, "revision": e.revision, "n_cycles": n, "since": since, "until": since + len(page),
            "records": records, "generated_from": gen_from, "generated": s.generated[gen_from:],
            "text_from": text_from, "text": text, "finish_reason": s.finish_reason, "new_tokens": len(s.generated)}
    if full:
        head.update({
            "prompt": s.prompt, "prompt_ids": s.prompt_ids, "policy": wire.policy_to_wire(s.policy),
            "temperature": s.sampling.temperature, "top_p": s.sampling.top_p, "top_k": s.sampling.top_k,
            "seed": s.seed, "max_new_tokens": s.max_new_tokens, "kernel_backend": s.kernel_backend,
            "record_topk": s.record_topk, "capture": s.capture is not None, "kv_shapes": s.kv_shapes(),
            "trace": wire.trace_head_to_wire(s.trace)})
    if timing is not None:
        head["timing"] = {**timing, "encode": time.perf_counter() - t0}
    raw = wire.dumps(head)
    return raw[:-1] + b',"cycles":[' + b",".join(page) + b"]}"  # the encoded cycles spliced in, not re-encoded


def cycle_frame(c, records: str, timing: dict | None = None) -> bytes:
    """One line of a /run stream: ``{"cycle": <record>, "timing"?: {...}}`` and a newline."""
    t0 = time.perf_counter()
    body = wire.dumps(wire.cycle_to_wire(c, records))
    if timing is None:
        return b'{"cycle":' + body + b"}\n"
    tail = wire.dumps({**timing, "encode": time.perf_counter() - t0})
    return b'{"cycle":' + body + b',"timing":' + tail + b"}\n"


def step_timing(step_seconds: float, c, route_start: float) -> dict:
    """Where a step's time went on the server: waiting for its cycle (the batch to fill, a cycle in flight,
    the hand-over between threads), the cycle itself, building its record (a stage of the cycle)."""
    cycle = c.seconds
    record = float(c.stage_seconds.get("record", 0.0))
    return {"wait": max(step_seconds - cycle, 0.0), "cycle": cycle - record, "record": record,
            "route": time.perf_counter() - route_start}
