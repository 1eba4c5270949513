"""Load benchmark of the served engine beside the same engine in process: what the server adds per step.

``python -m workbench bench-serve --clients 1,4,8,16``. A ``workbench serve`` subprocess (batching on)
runs on 127.0.0.1 with the same models as an engine loaded in this process. For each client count
``n`` the modes below are measured in turn, their order reversed every other repeat, so each sees the
same machine; client ``i`` generates from held-out prompt ``i``:

- ``inproc``: the ``n`` prompts as one batch in this process (``engine.batch_session``): what the engine
  does without a server. Its step is the batch's cycle;
- ``run``: ``n`` clients at once (``wb.connect``, one thread and connection each), each ``s.run()``: one
  request whose cycles stream back. A step is the time between two cycles arriving;
- ``step``: the same, each client calling ``s.step()`` until it ends: one request per cycle (the
  Stepper's path). A step is one request, from sending it to holding the decoded Cycle;
- ``serial``: the ``n`` clients of ``run`` one after another (the bar batching must clear: at once,
  ``n`` clients should be much faster than one at a time);
- ``whole``: what a client gets end to end: ``n`` clients at once, each opening its session (the prefill
  over HTTP), running it and closing it, timed from the first opening to the last closing, beside the
  in-process batch from its making (its prefill) on;
- ``unbatched`` (only when asked for): ``run`` on a second server started with ``--no-batching``.

Reported per mode and client count: new tokens per second over the generating phase (sessions are
made, and their prefill run, before it starts; ``whole``: from the first opening on), the median and range
over repeats; step latency
p50/p90/p99/max over every step; each served mode's tok/s and p50 step over ``inproc``'s, repeat by
repeat (median and range: the noise beside the effect); and where a served step's time goes, the
mean per step of what the server and the client measured (``wb.connect(..., timing=True)``):
``wait`` (for the batch to fill, a cycle in flight, the hand-over between threads), ``cycle``,
``record`` (building the cycle's record), ``encode``, ``http`` (a step: the server's framework, from
the request's head parsed to its handler: the body read and checked, the hand-over to a thread),
``wire`` (a step: its round trip less the server's share, so the transport, both ends' HTTP and the
reply's way out; a run: a step less wait, cycle and record, so encoding and decoding, which overlap
the next cycle there, are inside it) and ``decode`` (on the client); and how often
the scheduler's gather waited for a straggler, for how long, and how often its window ran out.
Nothing here needs a GPU: on a GPU host the same command runs with ``--device cuda``.
"""
from __future__ import annotations

import threading
import time

from workbench.bench.served_child import Server

MODES = ("inproc", "run", "step", "serial", "whole", "unbatched")
DEFAULT_MODES = ("inproc", "run", "step", "serial", "whole")
SERVED = ("run", "step", "serial", "whole", "unbatched")
PARTS = ("wait", "cycle", "record", "encode", "http", "wire", "decode")  # where a served step's time goes
GATHER = ("cycles", "rows_stepped", "gathers_waited", "gather_wait_seconds", "gathers_cut")


# ------------------------------------------------------------------------------------------ in process
def inproc_round(engine, prompts: list[str], clients: int, policy, max_new_tokens: int) -> dict:
    """The ``clients`` prompts as one batch: tokens, seconds of stepping, a step latency per live row, and
    the seconds of making the batch (its prefill) before them."""
    t = time.perf_counter()
    b = engine.batch_session([prompts[i % len(prompts)] for i in range(clients)], policy=policy,
                             max_new_tokens=max_new_tokens)
    opened = time.perf_counter() - t  # the batch's prefill, and the sessions' setup
    lat, parts = [], []
    t0 = time.perf_counter()
    while not b.finished:
        live = len(b.live)
        t = time.perf_counter()
        bc = b.step()
        took = time.perf_counter() - t
        lat += [took] * live  # every live row waited this step for its cycle, as a client does
        record = float(bc.stage_seconds.get("record", 0.0))
        parts += [{"wait": 0.0, "cycle": took - record, "record": record, "encode": None, "http": None,
                   "wire": None, "decode": None}] * live
    wall = time.perf_counter() - t0
    require_cycles(lat, [s.finish_reason for s in b.sessions])
    tokens = sum(len(s.generated) for s in b.sessions)
    return {"tokens": tokens, "seconds": wall, "latencies": [lat], "parts": parts, "gather": {},
            "open_seconds": opened}


def require_cycles(latencies: list, reasons: list) -> None:
    """A round in which no session made a cycle measured nothing (its tok/s would be the prefills' first tokens over
    no time): refused in one line, with why the sessions ended."""
    if not any(latencies):
        raise ValueError(f"no session made a cycle: each ended at its prefill ({reasons[0]}), so there is nothing "
                         "to time; give a pair and prompts that generate (--target/--draft, --split)")


# ------------------------------------------------------------------------------------------ served
class Clients:
    """The client side of a served round: one session per client, opened, driven to its end and closed, with
    when each phase ended (``whole``: all three on the client's own thread, from the round's start)."""

    def __init__(self, remotes: list, prompts: list[str], policy, max_new_tokens: int, how: str):
        n = len(remotes)
        self.remotes, self.prompts, self.policy, self.max_new_tokens = remotes, prompts, policy, max_new_tokens
        self.how = how  # "step": a request per cycle; otherwise s.run()
        self.sessions: list = [None] * n
        self.lat: list[list[float]] = [[] for _ in range(n)]
        self.busy = [0.0] * n  # each client's own generating time (serial: the round's time is their sum)
        self.ends = [0.0] * n  # when each session ended (at once: the generating phase runs to the last)
        self.closed = [0.0] * n  # when each was closed (whole: the round runs to the last)
        self.opened = [0.0] * n  # whole: how long after the round's start each was open
        self.errors: list[BaseException] = []

    def open(self, i: int) -> None:
        self.sessions[i] = self.remotes[i].session(self.prompts[i % len(self.prompts)], policy=self.policy,
                                                   max_new_tokens=self.max_new_tokens)

    def drive(self, i: int) -> None:
        s = self.sessions[i]
        try:
            t0 = time.perf_counter()
            if self.how == "step":
                while not s.finished:
                    t = time.perf_counter()
                    s.step()
                    self.lat[i].append(time.perf_counter() - t)
            else:
                s.run()
                at = [t0] + [x["at"] for x in s.timings]
                self.lat[i] = [b - a for a, b in zip(at, at[1:])]
            self.ends[i] = time.perf_counter()
            self.busy[i] = self.ends[i] - t0
            # Closed as soon as it ends, as in process a finished row leaves the batch (a finished session the
            # server still holds sits every later cycle out, its rows copied aside and back).
            s.close()
            self.closed[i] = time.perf_counter()
        except BaseException as e:  # noqa: BLE001 - reported by the round
            self.errors.append(e)

    def whole(self, i: int, t0: float) -> None:
        try:
            self.open(i)
        except BaseException as e:  # noqa: BLE001 - reported by the round
            self.errors.append(e)
            return
        self.opened[i] = time.perf_counter() - t0
        self.drive(i)


def served_round(server: Server, prompts: list[str], clients: int, policy: dict, max_new_tokens: int,
                 how: str) -> dict:
    """``clients`` sessions, at once (``how``: "run" or "step": opened before the clock starts, as the batch
    in process is), one after another ("serial"), or at once from their opening to their closing ("whole")."""
    from workbench.serve.client import connect
    from workbench.serve.wire import policy_from_wire

    remotes = [connect(server.url, token=server.token, timing=True) for _ in range(clients)]
    c = Clients(remotes, prompts, policy_from_wire(policy), max_new_tokens, how)
    before = server.batching()
    if how == "serial":  # one session at a time: made, run, closed, then the next
        for i in range(clients):
            c.open(i)
            c.drive(i)
        wall = sum(c.busy)
    else:
        if how != "whole":
            for i in range(clients):
                c.open(i)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=c.whole if how == "whole" else c.drive,
                                    args=(i, t0) if how == "whole" else (i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(3600)
        wall = max(c.closed if how == "whole" else c.ends) - t0
    after = server.batching()
    if c.errors:
        raise RuntimeError(f"a client failed: {type(c.errors[0]).__name__}: {c.errors[0]}")
    require_cycles([x for lat in c.lat for x in lat], [s.finish_reason for s in c.sessions])
    parts = [step_parts(t, how) for s in c.sessions for t in s.timings]
    gather = {k: after.get(k, 0) - before.get(k, 0) for k in GATHER if k in after}
    return {"tokens": sum(len(s.generated) for s in c.sessions), "seconds": wall, "latencies": c.lat,
            "parts": parts, "gather": gather, "open_seconds": max(c.opened) if how == "whole" else None}


def step_parts(t: dict, how: str) -> dict:
    """One received cycle's timing -> the seconds of each of PARTS (see the module's docstring)."""
    wait, cycle, record = t.get("wait", 0.0), t.get("cycle", 0.0), t.get("record", 0.0)
    out = {"wait": wait, "cycle": cycle, "record": record, "encode": t.get("encode", 0.0), "decode": t["decode"],
           "http": None, "wire": None}  # a stream's: not measured per cycle (summarise fills wire from the steps)
    if how == "step":
        out["http"] = t.get("http", 0.0)
        out["wire"] = max(t["round_trip"] - out["http"] - t.get("route", 0.0) - out["encode"], 0.0)
    return out


# ------------------------------------------------------------------------------------------ figures
def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[(len(v) - 1) // 2]


def summarise(rounds: list[dict]) -> dict:
    """Repeats of one (mode, clients): tok/s per repeat (median and range), latencies over all steps, the
    mean of each part of a step, and the gathers' counts summed over repeats."""
    rates = sorted(r["tokens"] / r["seconds"] for r in rounds)
    steps = [x for r in rounds for c in r["latencies"] for x in c]
    out = {"tok_s": _median(rates), "tok_s_range": [rates[0], rates[-1]], "steps": len(steps),
           "p50_ms": 1e3 * _pct(steps, 0.5), "p90_ms": 1e3 * _pct(steps, 0.9), "p99_ms": 1e3 * _pct(steps, 0.99),
           "max_ms": 1e3 * max(steps), "repeats": len(rounds)}
    parts = [p for r in rounds for p in r["parts"]]
    if parts:
        mean_step = sum(steps) / len(steps)
        means = {k: (sum(p[k] for p in parts) / len(parts) if all(p[k] is not None for p in parts) else None)
                 for k in PARTS}
        if means["wire"] is None and means["decode"] is not None:  # a stream: the steps beyond the server's part
            means["wire"] = max(mean_step - means["wait"] - means["cycle"] - means["record"], 0.0)
        out["parts_ms"] = {k: None if v is None else 1e3 * v for k, v in means.items()}
        out["mean_step_ms"] = 1e3 * mean_step
    opens = [r["open_seconds"] for r in rounds if r.get("open_seconds") is not None]
    if opens:  # whole: until every session was open; in process: the batch's making
        out["open_ms"] = 1e3 * _median(opens)
    gathers = [r["gather"] for r in rounds if r["gather"]]
    if gathers:
        out["gather"] = {k: sum(x.get(k, 0) for x in gathers) for k in GATHER}
    return out


def measure_served_load(model_args: list[str], load_local, prompts: list[str], clients: list[int], policy: dict,
                        max_new_tokens: int, repeats: int = 1, threads: int | None = None, modes=DEFAULT_MODES,
                        progress=None) -> dict:
    """Every mode for every client count, interleaved. ``load_local()``: the same engine in this process.
    -> {"rows": [...], ...}"""
    from workbench.serve.wire import policy_from_wire

    modes = [m for m in MODES if m in modes]
    most = max(clients)
    servers: dict[str, Server] = {}
    try:
        if any(m in SERVED and m != "unbatched" for m in modes):
            servers["batched"] = Server(model_args, True, most, threads)
        if "unbatched" in modes:
            servers["unbatched"] = Server(model_args, False, most, threads)
        engine = load_local() if "inproc" in modes else None
        pol = policy_from_wire(policy)

        def one(mode: str, n: int, tokens: int) -> dict:
            if mode == "inproc":
                return inproc_round(engine, prompts, n, pol, tokens)
            server = servers["unbatched" if mode == "unbatched" else "batched"]
            return served_round(server, prompts, n, policy, tokens, "run" if mode == "unbatched" else mode)

        for mode in modes:  # warm-up: the first forwards of a process (and a connection's first request) are slower
            one(mode, min(2, most), 8)
        rows = []
        for n in clients:
            got: dict[str, list] = {m: [] for m in modes}
            for rep in range(repeats):
                for mode in (modes if rep % 2 == 0 else modes[::-1]):
                    got[mode].append(one(mode, n, max_new_tokens))
                    r = got[mode][-1]
                    if progress:
                        progress(f"{n} client(s), {mode}, repeat {rep + 1}/{repeats}: {r['tokens'] / r['seconds']:.1f} "
                                 "tok/s")
            row = {"clients": n, **{m: summarise(got[m]) for m in modes}}
            if "inproc" in modes:  # repeat by repeat: each served repeat over the in-process one beside it
                add_ratios(row, got)
            if "run" in modes and "serial" in modes and n > 1:  # (one client: the same thing twice)
                row["at_once_vs_serial"] = [_rate(a) / _rate(b) for a, b in zip(got["run"], got["serial"])]
            rows.append(row)
        add_batch_gain(rows)
    finally:
        for s in servers.values():
            s.close()
    return {"rows": rows, "policy": policy, "max_new_tokens": max_new_tokens, "repeats": repeats, "modes": modes,
            "prompts": len(prompts), "model_args": model_args, "threads": threads}


def add_ratios(row: dict, got: dict[str, list]) -> None:
    """Each served mode's rounds over the in-process ones beside them, repeat by repeat: tok/s (``whole``: over
    the batch's from its making on), p50 step, and what the server added to the p50 step, in ms."""
    inproc = got["inproc"]
    if "whole" in got:  # the batch's rate from its making on, beside the served one from the first opening
        row["inproc"]["tok_s_whole"] = _median([_whole_rate(r) for r in inproc])
    for m, rounds in got.items():
        if m not in SERVED or m == "serial":
            continue
        base = _whole_rate if m == "whole" else _rate
        row[m]["tok_s_vs_inproc"] = [_rate(a) / base(b) for a, b in zip(rounds, inproc)]
        row[m]["p50_vs_inproc"] = [_p50(a) / _p50(b) for a, b in zip(rounds, inproc)]
        row[m]["p50_added_ms"] = [1e3 * (_p50(a) - _p50(b)) for a, b in zip(rounds, inproc)]


def add_batch_gain(rows: list[dict]) -> None:
    """Each row of more than one client gets ``inproc_batch_gain``: in-process tok/s at that batch over one
    request's (medians), what batching gains the engine itself on this machine, so the bar for at-once over
    one-after-another reads beside its ceiling. Without a one-client in-process row, nothing is added."""
    one = next((r for r in rows if r["clients"] == 1 and "inproc" in r), None)
    for r in rows:
        if one is not None and r["clients"] > 1 and "inproc" in r:
            r["inproc_batch_gain"] = r["inproc"]["tok_s"] / one["inproc"]["tok_s"]


def _rate(r: dict) -> float:
    return r["tokens"] / r["seconds"]


def _whole_rate(r: dict) -> float:
    return r["tokens"] / (r["open_seconds"] + r["seconds"])


def _p50(r: dict) -> float:
    return _pct([x for c in r["latencies"] for x in c], 0.5)


def _spread(values: list[float]) -> str:
    """'1.23x [1.10-1.40]': the median over repeats and their range (the noise beside the effect)."""
    return f"{_median(values):.2f}x" + (f" [{min(values):.2f}-{max(values):.2f}]" if len(values) > 1 else "")


def table(res: dict) -> str:
    from workbench.serve import wire

    policy = wire.policy_from_wire(res["policy"])  # the wire's object, named as the CLI's --policy names it
    threads = f", {res['threads']} CPU thread(s) each side" if res.get("threads") else ""
    lines = [f"served engine under load: {policy}, {res['max_new_tokens']} new tokens per session, "
             f"{res['repeats']} repeat(s){threads}, modes interleaved (run: one streamed request per session; step: "
             "one request per cycle; whole: each session opened, run and closed)",
             f"{'clients':>7}  {'mode':<9} {'tok/s':>7} {'[range]':<15} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} "
             f"{'max ms':>7}   tok/s / in-process    p50 / in-process"]
    for r in res["rows"]:
        lines += row_lines(r, res.get("modes", MODES))
    return "\n".join(lines + parts_lines(res))


def row_lines(r: dict, modes) -> list[str]:
    """One client count: a line per mode, then what compares them."""
    lines = []
    for m in modes:
        x = r.get(m)
        if x is None:
            continue
        lo, hi = x.get("tok_s_range", [x["tok_s"], x["tok_s"]])
        vs = (f"   {_spread(x['tok_s_vs_inproc']):<20} {_spread(x['p50_vs_inproc'])}"
              if "tok_s_vs_inproc" in x else "")
        lines.append(f"{r['clients']:>7}  {m:<9} {x['tok_s']:>7.1f} {f'[{lo:.0f}-{hi:.0f}]':<15} "
                     f"{x['p50_ms']:>7.1f} {x['p90_ms']:>7.1f} {x['p99_ms']:>7.1f} {x['max_ms']:>7.1f}{vs}")
    if "at_once_vs_serial" in r:
        lines.append(f"{'':>7}  {r['clients']} clients at once (run) over one after another (serial): "
                     f"{_spread(r['at_once_vs_serial'])}")
    if "inproc_batch_gain" in r:  # (serial also pays each session's own requests, so at-once may pass it a little)
        lines.append(f"{'':>7}  in process, a batch of {r['clients']} over one request (medians): "
                     f"{r['inproc_batch_gain']:.2f}x: what batching gains the engine itself on this machine")
    x, inproc = r.get("whole"), r.get("inproc")
    if x is not None and inproc is not None and "tok_s_vs_inproc" in x:
        lines.append(f"{'':>7}  {r['clients']} client(s) opening, running and closing at once (whole) over the "
                     f"in-process batch from its making on ({inproc['tok_s_whole']:.1f} tok/s): "
                     f"{_spread(x['tok_s_vs_inproc'])}; every session open after {x['open_ms']:.0f} ms, the batch "
                     f"made (its prefill) in {inproc['open_ms']:.0f} ms (medians)")
    return lines


def parts_lines(res: dict) -> list[str]:
    """Where a served step goes, beside the same step in process, and what the server added to it."""
    parts = [(r["clients"], m, r[m]) for r in res["rows"] for m in res.get("modes", MODES)
             if m in r and "parts_ms" in r[m]]
    if not parts:
        return []
    lines = ["", "where a served step goes, beside the same step in process (mean ms per step; run: encode and "
             "decode overlap the next cycle, and wire holds what a step took beyond wait + cycle + record)",
             f"{'clients':>7}  {'mode':<9} {'step':>7} " + " ".join(f"{k:>7}" for k in PARTS)
             + "   gather: cycles, rows per cycle; waited (share of cycles), mean ms; window ran out"]
    for n, m, x in parts:
        p = x["parts_ms"]
        g = x.get("gather")
        gtxt = ""
        if g and g.get("cycles"):
            waited = g["gathers_waited"]
            mean = 1e3 * g["gather_wait_seconds"] / waited if waited else 0.0
            gtxt = (f"   {g['cycles']}, {g['rows_stepped'] / g['cycles']:.1f}; {waited} "
                    f"({waited / g['cycles']:.0%}), {mean:.2f}; {g['gathers_cut']}")
        lines.append(f"{n:>7}  {m:<9} {x['mean_step_ms']:>7.2f} "
                     + " ".join(f"{'-':>7}" if p[k] is None else f"{p[k]:>7.2f}" for k in PARTS) + gtxt)
    return lines + added_lines(res, parts)


def added_lines(res: dict, parts: list) -> list[str]:
    """Served p50 step less in-process p50, repeat by repeat, with what one repeat or a figure below 0 means."""
    inproc = {r["clients"]: r["inproc"]["p50_ms"] for r in res["rows"] if "inproc" in r}
    shown = [(n, m, x.get("p50_added_ms") or [x["p50_ms"] - inproc[n]]) for n, m, x in parts
             if n in inproc and m in ("run", "step")]
    if not shown:
        return []
    many = res.get("repeats", 1) > 1
    over = ", median [range] over repeats" if many else ""
    lines = [f"added per step by the server (served p50 - in-process p50{over}): "
             + "; ".join(f"{n} client(s) {m}: {_ms_spread(v)}" for n, m, v in shown)]
    if any(_median(v) < 0 for _, _, v in shown):
        lines.append("  below 0 is noise between rounds, not a saving: a server cannot make the engine's step faster"
                     + ("; one repeat shows no range to judge it by: give --repeats 3 or more" if not many else ""))
    elif not many:
        lines.append("  one repeat: no range shows the noise between rounds; give --repeats 3 or more before reading "
                     "these")
    return lines


def _ms_spread(values: list[float]) -> str:
    """'+0.40 ms [-0.20 to +1.10]': the median over repeats and their range."""
    v = sorted(values)
    return f"{_median(v):+.2f} ms" + (f" [{v[0]:+.2f} to {v[-1]:+.2f}]" if len(v) > 1 else "")
