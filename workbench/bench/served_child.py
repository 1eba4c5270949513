"""bench-serve's ``workbench serve`` subprocess: started on a free port (``Server``), and ended with bench-serve
however bench-serve ends.

``python -m workbench.bench.served_child ARGS`` is ``workbench serve ARGS`` that also watches its stdin, a pipe
whose write end only bench-serve holds and never writes to. When bench-serve exits, is stopped (SIGTERM,
SIGINT) or killed (SIGKILL, a timeout wrapper), the pipe closes, the read returns and the server stops as on
SIGTERM (a running cycle finishes, its sessions are dropped), or is ended outright ``GRACE`` seconds later: no
server (the models loaded, gigabytes) outlives the bench. The token comes on the server's stdout, a pipe only
bench-serve reads, so no token file is written and none can be left behind.

Only the standard library is imported at the top: the watch starts before the models load.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

GRACE = 10.0  # seconds the server has to stop once its parent is gone, before it is ended outright


def watch_parent(fd: int) -> threading.Thread:
    """Stop this process (SIGTERM, then ``os._exit`` after GRACE s) once file descriptor ``fd`` reaches its end:
    the parent closed the pipe, or died and the system closed it. (Read by ``os.read``, not through
    ``sys.stdin``, whose lock a reader blocked at exit would hold while the interpreter shuts down.)"""
    def watch() -> None:
        while os.read(fd, 4096):
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE)
        os._exit(1)

    t = threading.Thread(target=watch, name="bench-serve-parent-watch", daemon=True)
    t.start()
    return t


def serve(argv: list[str]) -> int:
    """``workbench serve`` with ``argv``, watching stdin (see the module's docstring); a refusal is one line on
    stderr, as the command line gives it (bench-serve reports that line)."""
    import argparse

    from workbench.cli_args.values import UsageError
    from workbench.serve import command

    watch_parent(sys.stdin.fileno())
    parser = argparse.ArgumentParser(prog="workbench")
    command.add_parser(parser.add_subparsers(dest="command"))
    try:
        return command.run(parser.parse_args(["serve", *argv]), sys.stdout, sys.stderr)
    except (UsageError, ValueError, RuntimeError, OSError, ImportError) as e:
        print(f"workbench: error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
        return 2


def child_command(model_args: list[str], batching: bool, max_sessions: int, threads: int | None) -> list[str]:
    """The command line of one server: a free port, no token file (its token comes on stdout)."""
    cmd = [sys.executable, "-m", "workbench.bench.served_child", "--port", "0", "--max-sessions", str(max_sessions),
           "--log-level", "warning", *model_args]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if not batching:
        cmd.append("--no-batching")
    return cmd


def read_start(lines) -> tuple[str | None, str | None]:
    """(url, token) from the server's first lines of output, once both came; None for what never came."""
    url = token = None
    for line in lines:
        m = re.search(r"listening on (http://\S+)", line)
        url = m.group(1) if m else url
        m = re.search(r"token \(generated\): (\S+)", line)
        token = m.group(1) if m else token
        if url and token:
            break
    return url, token


class Server:
    """One served engine in a subprocess on a free port; ``close()`` stops it (bench-serve's end does too)."""

    def __init__(self, model_args: list[str], batching: bool, max_sessions: int, threads: int | None):
        self.proc = subprocess.Popen(child_command(model_args, batching, max_sessions, threads), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            self.url, self.token = read_start(self.proc.stdout)  # printed once the models are loaded
            if self.url is None or self.token is None:
                err = [x for x in self.proc.stderr.read().splitlines() if x.strip()]
                why = next((x for x in err if x.startswith("workbench: error: ")), err[-1] if err else "no output")
                raise RuntimeError(f"workbench serve did not start: {why.removeprefix('workbench: error: ')}")
        except BaseException:
            self.close()
            raise
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain: a full pipe would block it
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def batching(self) -> dict:
        """The scheduler's counts (``/health``), to tell one round's gathers from the next one's."""
        req = urllib.request.Request(self.url + "/health", headers={"Authorization": f"Bearer {self.token}"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=60) as r:
            return json.loads(r.read()).get("batching") or {}

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # (the server's watch sees its end too)
            except OSError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
