"""Load benchmark of the served engine: N clients stepping DDTree sessions at once, batching on and off.

``python -m workbench bench-serve --clients 1,4,8,16``. Two servers (``workbench serve``, one with
``--no-batching``) run as subprocesses on 127.0.0.1 with the same models; for each client count the
two are measured back to back (the order alternating between repeats), so both see the same machine.
Each client opens its own connection, creates a session on one of the held-out evaluation prompts,
and once every client is ready steps it one cycle per request (``POST /sessions/{id}/step``) until it
ends. Reported per mode and client count: total new tokens per second over the stepping phase, per-step
latency p50/p90/p99/max over every step, and the worst client's max. Nothing here needs a GPU: on a GPU
host the same command runs with ``--device cuda``.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MODES = ("batched", "unbatched")


class Server:
    """One ``workbench serve`` subprocess on a free port, with its own token file."""

    def __init__(self, model_args: list[str], batching: bool, max_sessions: int, threads: int | None):
        self.dir = tempfile.mkdtemp(prefix="wb-bench-serve-")
        self.token_file = Path(self.dir) / "token"
        cmd = [sys.executable, "-m", "workbench", "serve", "--port", "0", "--token-file", str(self.token_file),
               "--max-sessions", str(max_sessions), "--log-level", "warning", *model_args]
        if threads is not None:
            cmd += ["--threads", str(threads)]
        if not batching:
            cmd.append("--no-batching")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.url = None
        for line in self.proc.stdout:  # the server prints its address once the models are loaded
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        if self.url is None:
            err = self.proc.stderr.read()
            raise RuntimeError(f"workbench serve did not start: {err.strip().splitlines()[-1] if err.strip() else 'no output'}")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain: a full pipe would block it
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        self.token = self.token_file.read_text().strip()
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host.strip("[]"), int(port)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.token_file.unlink(missing_ok=True)
        os.rmdir(self.dir)


def _call(conn: http.client.HTTPConnection, token: str, method: str, path: str, body=None) -> dict:
    from workbench.serve import wire

    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Authorization": f"Bearer {token}",
                                                   "Content-Type": "application/json",
                                                   wire.VERSION_HEADER: str(wire.WIRE_VERSION)})
    r = conn.getresponse()
    payload = r.read()
    if r.status >= 300:
        raise RuntimeError(f"{method} {path}: {r.status} {payload[:300].decode(errors='replace')}")
    return json.loads(payload)


def end_session(server, conn: http.client.HTTPConnection, sid: str) -> None:
    """DELETE the session, on a fresh connection when the server has closed this one.

    A client that finished early waits for the others with its connection idle; past uvicorn's
    keep-alive timeout (5 s) the server closes it. A delete lost there would leave the session
    live, and the next round on that server would meet max_sessions (429)."""
    try:
        _call(conn, server.token, "DELETE", f"/sessions/{sid}")
    except (http.client.HTTPException, ConnectionError):
        conn.close()
        fresh = http.client.HTTPConnection(server.host, server.port, timeout=60)
        try:
            _call(fresh, server.token, "DELETE", f"/sessions/{sid}")
        finally:
            fresh.close()


def one_round(server: Server, prompts: list[str], clients: int, policy: dict, max_new_tokens: int) -> dict:
    """``clients`` sessions stepped at once until each ends. -> tokens, wall seconds, step latencies."""
    ready = threading.Barrier(clients + 1)
    done = threading.Barrier(clients + 1)
    lat: list[list[float]] = [[] for _ in range(clients)]
    tokens = [0] * clients
    errors: list[BaseException] = []

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
        sid = None
        try:
            st = _call(conn, server.token, "POST", "/sessions", {"prompt": prompts[i % len(prompts)], "policy": policy,
                                                                 "max_new_tokens": max_new_tokens})
            sid = st["id"]
            ready.wait()
            n = 0
            while st["finish_reason"] is None:
                t0 = time.perf_counter()
                st = _call(conn, server.token, "POST", f"/sessions/{sid}/step", {"since": n})
                lat[i].append(time.perf_counter() - t0)
                n += 1
            tokens[i] = len(st["generated"])
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
            ready.abort()
        finally:
            try:
                done.wait()
            except threading.BrokenBarrierError:
                pass
            if sid is not None:
                try:
                    end_session(server, conn, sid)
                except Exception as e:  # noqa: BLE001 - reported by the caller
                    errors.append(e)
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        pass
    t0 = time.perf_counter()
    try:
        done.wait()
    except threading.BrokenBarrierError:
        pass
    wall = time.perf_counter() - t0
    for t in threads:
        t.join(60)
    if errors:
        raise RuntimeError(f"a client failed: {errors[0]}")
    return {"tokens": sum(tokens), "seconds": wall, "latencies": lat}


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def summarise(rounds: list[dict]) -> dict:
    """Repeats of one (mode, clients): tok/s per repeat (median and range) and latencies over all steps."""
    rates = sorted(r["tokens"] / r["seconds"] for r in rounds)
    steps = [x for r in rounds for c in r["latencies"] for x in c]
    worst = max(max(c) for r in rounds for c in r["latencies"] if c)
    return {"tok_s": rates[(len(rates) - 1) // 2], "tok_s_range": [rates[0], rates[-1]], "steps": len(steps),
            "p50_ms": 1e3 * _pct(steps, 0.5), "p90_ms": 1e3 * _pct(steps, 0.9), "p99_ms": 1e3 * _pct(steps, 0.99),
            "max_ms": 1e3 * max(steps), "worst_client_max_ms": 1e3 * worst, "repeats": len(rounds)}


def bench_serve(model_args: list[str], prompts: list[str], clients: list[int], policy: dict, max_new_tokens: int,
                repeats: int = 1, threads: int | None = None, progress=None) -> dict:
    """Both modes for every client count, measured back to back. -> {"rows": [...], ...}"""
    most = max(clients)
    servers = {}
    try:
        for mode in MODES:
            servers[mode] = Server(model_args, mode == "batched", max(most, 1), threads)
        for mode in MODES:  # warm-up: the first forwards of a process are slower
            one_round(servers[mode], prompts, min(2, most), policy, 8)
        rows = []
        for n in clients:
            got = {m: [] for m in MODES}
            for rep in range(repeats):
                order = MODES if rep % 2 == 0 else MODES[::-1]
                for mode in order:
                    got[mode].append(one_round(servers[mode], prompts, n, policy, max_new_tokens))
                    if progress:
                        progress(f"{n} client(s), {mode}, repeat {rep + 1}/{repeats}: "
                                 f"{got[mode][-1]['tokens'] / got[mode][-1]['seconds']:.1f} tok/s")
            row = {"clients": n, **{m: summarise(got[m]) for m in MODES}}
            row["batched_over_unbatched"] = [b["tokens"] / b["seconds"] / (u["tokens"] / u["seconds"])
                                             for b, u in zip(got["batched"], got["unbatched"])]
            rows.append(row)
    finally:
        for s in servers.values():
            s.close()
    return {"rows": rows, "policy": policy, "max_new_tokens": max_new_tokens, "repeats": repeats,
            "prompts": len(prompts), "model_args": model_args, "threads": threads}


def table(res: dict) -> str:
    from workbench.serve import wire

    policy = wire.policy_from_wire(res["policy"])  # the wire's object, named as the CLI's --policy names it
    lines = [f"served engine under load: {policy}, {res['max_new_tokens']} new tokens per session, "
             f"{res['repeats']} repeat(s), one step per request",
             f"{'clients':>7}  {'mode':<9} {'tok/s':>7}  {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7}   batched/unbatched"]
    for r in res["rows"]:
        ratio = r["batched_over_unbatched"]
        for m in MODES:
            x = r[m]
            extra = ""
            if m == "batched":
                extra = f"   {sorted(ratio)[(len(ratio) - 1) // 2]:.2f}x" + (
                    f" [{min(ratio):.2f}-{max(ratio):.2f}]" if len(ratio) > 1 else "")
            lines.append(f"{r['clients']:>7}  {m:<9} {x['tok_s']:>7.1f}  {x['p50_ms']:>7.1f} {x['p90_ms']:>7.1f} "
                         f"{x['p99_ms']:>7.1f} {x['max_ms']:>7.1f}{extra}")
    return "\n".join(lines)
